"""Write a tiny random-weight Llama (hidden 64, 2 heads: head_dim 32) with a BPE tokenizer.

No hub access: the tokenizer is trained on the Python standard library's own sources.
Runs inside the vLLM venv (it needs torch, transformers and tokenizers).
Usage: python make_model.py OUT_DIR
"""

from __future__ import annotations

import glob
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def main(out: str) -> None:
    stdlib = os.path.dirname(os.__file__)
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:200]
    if not files:
        raise SystemExit(f"no stdlib sources under {stdlib} to train the tokenizer on")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=2000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    print("tiny model written to", out)


if __name__ == "__main__":
    main(sys.argv[1])
