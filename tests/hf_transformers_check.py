#!/usr/bin/env python3
"""Hugging Face transformers itself on what `xloco export --format hf` writes (issue 55):
AutoModelForCausalLM and AutoTokenizer load the directory the way a user would, with nothing
passed but the path.

    hf_transformers_check.py HF_DIR LOGITS.safetensors TEXT_FILE [--tol 1e-4] [--lines 200]

- logits: transformers' GPT-2 on the tokens in LOGITS.safetensors (written by `xloco eval
  --logits-out`) against xloco's logits there: max |diff| <= --tol;
- tokenizer: the first --lines non-empty lines of TEXT_FILE (training text) encoded and decoded
  by AutoTokenizer come back byte for byte, and its ids equal SentencePiece's own encoder's
  with the exported tokenizer.model (the ids xloco trains on).
Prints one line per check; exits 1 when one fails, 77 when transformers is not installed."""
import argparse
import sys
from pathlib import Path

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:  # the ctest reports it skipped, with the reason
    print(f"skipped: transformers or torch is not importable here ({e})")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("logits")
    ap.add_argument("text")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--lines", type=int, default=200)
    a = ap.parse_args()
    failed = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failed.append(what)

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    model = AutoModelForCausalLM.from_pretrained(a.hf_dir, local_files_only=True,
                                                 dtype=torch.float32)
    model.eval()
    ref = load_file(a.logits)
    tokens = ref["tokens"].long()
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    with torch.no_grad():
        mine = model(input_ids=tokens).logits.double()
    diff = (mine.reshape(ref["logits"].shape) - ref["logits"].double()).abs().max().item()
    check(diff <= a.tol, f"{type(model).__name__} logits vs xloco's on {tokens.numel()} tokens: "
          f"max |diff| {diff:.3g} (tolerance {a.tol:g})")

    tok = AutoTokenizer.from_pretrained(a.hf_dir, local_files_only=True)
    lines = [l for l in Path(a.text).read_text(encoding="utf-8").splitlines(keepends=True)
             if l.strip()][:a.lines]
    sample = "".join(lines)
    ids = tok.encode(sample, add_special_tokens=False)
    back = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    first = next((i for i, (x, y) in enumerate(zip(sample, back)) if x != y),
                 min(len(sample), len(back)))
    check(back.encode("utf-8") == sample.encode("utf-8"),
          f"{type(tok).__name__} round-trips {len(lines)} lines ({len(sample.encode())} bytes, "
          f"{len(ids)} ids) byte for byte" +
          ("" if back == sample else f"; first difference at character {first}: "
           f"{sample[first:first + 20]!r} became {back[first:first + 20]!r}"))
    # The ids themselves are those xloco trained on: SentencePiece's own encoder with the same
    # model (xloco prepare's token files equal spm_encode's, ctest tokens.cli).
    import sentencepiece
    spm = sentencepiece.SentencePieceProcessor(model_file=str(Path(a.hf_dir) / "tokenizer.model"))
    check(ids == spm.encode(sample), f"AutoTokenizer's ids equal SentencePiece's ({len(ids)} ids)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
