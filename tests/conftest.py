import pytest
import torch

from dmtp import tiny
from dmtp.drafter import Drafter, DrafterConfig

torch.set_num_threads(2)


@pytest.fixture(scope="session", params=["qwen3_5", "qwen3"])
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def models(arch):
    return tiny.build(arch, seed=0)


def make_drafter(tgt, variant, layers=2, seed=1, **kw):
    torch.manual_seed(seed)
    c = DrafterConfig(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                      num_target_layers=tgt.num_layers, variant=variant, mask_token_id=2, lowrank_rank=8, **kw)
    d = Drafter(c)
    # give zero-initialised injection weights some value so every path is exercised
    with torch.no_grad():
        for n, p in d.injection.named_parameters():
            if p.dim() >= 2 and p.abs().sum() == 0:
                p.normal_(0, 0.05)
    return d.eval()


def hf_greedy(tgt, prompt, max_new, eos=None):
    out = tgt.model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()
