"""Training: target + MTP pretraining (`pretrain`) and drafter training for every variant side by side
(`drafters`), data-parallel under torchrun through `dmtp.dist`."""
