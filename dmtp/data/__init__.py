"""Data stage for the suite's own small Python-code model: corpus -> tokenizer -> token stream -> prompts."""
from dmtp.data.corpus import build_corpus, from_hf_dataset, iter_documents
from dmtp.data.datasets import humaneval_prompts
from dmtp.data.prompts import code_prompts
from dmtp.data.tokenizer import encode_corpus, load_tokenizer, train_tokenizer

__all__ = ["build_corpus", "from_hf_dataset", "iter_documents", "train_tokenizer", "load_tokenizer",
           "encode_corpus", "code_prompts", "humaneval_prompts"]
