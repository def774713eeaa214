"""Writes the expected token ids that crates/weft-data/tests/tokenizer_reference.rs checks.

Run by hand (needs tiktoken, tokenizers and numpy; CI never runs it) from the repository root:

    python3 tools/reference/make_tokenizer_fixtures.py [--ranks-dir DIR] [--shakespeare FILE]
                                                        [--only gpt2|tiny|qwen]

(`--only qwen` and `--only tiny` need only the tokenizers package.)

GPT-2's byte-level BPE: Python tiktoken's `r50k_base` encoding, built from the published
`r50k_base.tiktoken` ranks (sha256 checked against tiktoken's own expected hash, so the file is
exactly OpenAI's). tiktoken would download it; offline, `--ranks-dir` names a folder holding it
(default: the `assets` folder of the tiktoken-rs crate in the local cargo registry). As a second,
independent source the script also builds tiktoken's `gpt2` encoding from GPT-2's original release
files `vocab.bpe` (hash checked) and `encoder.json` and asserts both give the same ids.

It writes into crates/weft-data/tests/fixtures/:

- gpt2_torture.json: {"text", "ids"} for a Unicode and whitespace torture text (written below).
- gpt2_shakespeare.json: {"bytes", "sha256_text", "count", "sha256_ids_u32le", "first_ids"} for
  Tiny Shakespeare: the id count, the sha256 of the ids as little-endian u32, the first 2,000 ids.
- tiny_bpe_tokenizer.json: a small byte-level BPE Hugging Face tokenizer (trained here on a few
  sentences, 300 tokens, with an `<|endoftext|>` added special token).
- tiny_bpe_expected.json: {"cases": [{"text", "ids", "decoded"}]} from the Python `tokenizers`
  package (encode without added special tokens; decode keeping special tokens).
- qwen_style_tokenizer.json, qwen_style_expected.json: the same for a tokenizer of the form
  Qwen2's and Qwen3's tokenizer.json take (NFC normalization, a `Split` pre-tokenizer on their
  regex with lookahead, then byte-level without its own regex, and their three special tokens),
  trained here on a part of Tiny Shakespeare to 600 tokens.

Encoding is tiktoken's `encode_ordinary`: `<|endoftext|>` inside text is plain text.
"""

import argparse
import glob
import hashlib
import json
import os

import tokenizers

OUT = "crates/weft-data/tests/fixtures"

R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"

TORTURE = (
    "Hello, world! It's a test. IT'S LOUD. We're here; they've gone; I'm fine; you'll see; he'd go.\n"
    "WE'RE HERE; THEY'VE GONE; I'M FINE; YOU'LL SEE; HE'D GO; DON'T; can't won't shouldn't.\n"
    "Combining: e\u0301 a\u0300\u0301 n\u0303o\u0308 Zalgo: Z\u0351\u036b\u0343a\u0310l\u0352g\u0301o\u0300\n"
    "Emoji: \U0001F600 \U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 "
    "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F1EB\U0001F1F7 \u2764\uFE0F\n"
    "CJK: \u6f22\u5b57\u304b\u306a\u30ab\u30ca \ud55c\uad6d\uc5b4 \u4e2d\u6587\u6587\u672c\u3002\uff01\n"
    "RTL: \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u200f\u200e\n"
    "Windows line\r\nends\r\n\r\nand\ttabs\t\tand  two   three    four     spaces      \n"
    "   leading spaces and trailing   \n\n\n\n"
    "Digits: 0 1 12 123 1234 12345 123456789012345678901234567890 3.14159 1,000,000 -42 0x1F\n"
    "<|endoftext|> as plain text, and <|endoftext|><|endoftext|> twice; <|fim_prefix|>\n"
    "Mixed: caf\u00e9 na\u00efve \u00c5ngstr\u00f6m \u00df \u0130stanbul \u2126 \u212b \ufb01 \u00bd \u2460\n"
    "Punct: ... --- !!! ??? ''' \"\"\" ``` ~~~ @#$%^&*()_+{}|:<>?[]\\;',./\n"
    "Zero-width: a\u200bb\u200cc\u200dd\ufeffe \u00a0nbsp\u2003emsp\u3000ideo\n"
    "Tail with no newline 's 'S 't 'T 're 'RE 've 'VE 'm 'M 'll 'LL 'd 'D"
)

TINY_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine; the early bird catches the worm",
    "to be, or not to be: that is the question",
    "caf\u00e9 na\u00efve \u6f22\u5b57 \U0001F600 tabs\tand  spaces",
    "the the the then there their they them these those",
]

TINY_CASES = [
    "the quick brown fox",
    "there they then these",
    "unseen words: zebra xylophone",
    "caf\u00e9 \U0001F600 \u6f22\u5b57\ttab  two spaces\r\n",
    "a<|endoftext|>b",
    "",
]


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def find_ranks_dir(arg):
    if arg:
        return arg
    home = os.path.expanduser("~/.cargo/registry/src")
    hits = sorted(glob.glob(os.path.join(home, "*", "tiktoken-rs-*", "assets", "r50k_base.tiktoken")))
    if not hits:
        raise SystemExit("r50k_base.tiktoken not found: pass --ranks-dir")
    return os.path.dirname(hits[-1])


def encodings(ranks_dir):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe
    from tiktoken_ext import openai_public

    r50k_path = os.path.join(ranks_dir, "r50k_base.tiktoken")
    ranks = load_tiktoken_bpe(r50k_path, expected_hash=R50K_SHA256)
    r50k = tiktoken.Encoding(
        name="r50k_base",
        pat_str=openai_public.r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )
    vocab_bpe = os.path.join(ranks_dir, "vocab.bpe")
    encoder_json = os.path.join(ranks_dir, "encoder.json")
    assert sha256_file(vocab_bpe) == VOCAB_BPE_SHA256, vocab_bpe
    # encoder.json as shipped in tiktoken-rs is reformatted (its hash differs from the release's);
    # tiktoken checks that its ids agree with vocab.bpe's merge order, which is what matters.
    gpt2_ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=vocab_bpe,
        encoder_json_file=encoder_json,
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=None,
    )
    gpt2 = tiktoken.Encoding(
        name="gpt2",
        pat_str=openai_public.r50k_pat_str,
        mergeable_ranks=gpt2_ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )
    return r50k, gpt2


def write_json(name, value):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=None)
        f.write("\n")
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks-dir")
    ap.add_argument("--shakespeare", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--only", choices=["gpt2", "tiny", "qwen"])
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.only in (None, "gpt2"):
        gpt2_fixtures(args)
    if args.only in (None, "tiny"):
        tiny_fixtures()
    if args.only in (None, "qwen"):
        qwen_style_fixtures(args)


def cases_of(tok, texts):
    cases = []
    for t in texts:
        enc = tok.encode(t, add_special_tokens=False)
        cases.append({"text": t, "ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    return cases


def gpt2_fixtures(args):
    import numpy as np

    r50k, gpt2 = encodings(find_ranks_dir(args.ranks_dir))

    ids = r50k.encode_ordinary(TORTURE)
    assert ids == gpt2.encode_ordinary(TORTURE)
    assert r50k.decode(ids) == TORTURE
    write_json("gpt2_torture.json", {"text": TORTURE, "ids": ids})

    with open(args.shakespeare, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    ids = r50k.encode_ordinary(text)
    assert ids == gpt2.encode_ordinary(text)
    le = np.asarray(ids, dtype="<u4").tobytes()
    write_json(
        "gpt2_shakespeare.json",
        {
            "bytes": len(raw),
            "sha256_text": hashlib.sha256(raw).hexdigest(),
            "count": len(ids),
            "sha256_ids_u32le": hashlib.sha256(le).hexdigest(),
            "first_ids": ids[:2000],
        },
    )



def tiny_fixtures():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_CORPUS, trainer=trainer)
    path = os.path.join(OUT, "tiny_bpe_tokenizer.json")
    tok.save(path, pretty=True)
    print("wrote", path)
    tok = Tokenizer.from_file(path)
    write_json(
        "tiny_bpe_expected.json",
        {"tokenizers_version": tokenizers.__version__, "vocab_size": tok.get_vocab_size(),
         "cases": cases_of(tok, TINY_CASES)},
    )


# Qwen2's and Qwen3's pre-tokenizer pattern (their tokenizer.json's `Split`)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def qwen_style_fixtures(args):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(args.shakespeare, encoding="utf-8") as f:
        tok.train_from_iterator([f.read()[:200_000]], trainer=trainer)
    path = os.path.join(OUT, "qwen_style_tokenizer.json")
    tok.save(path, pretty=True)
    print("wrote", path)
    tok = Tokenizer.from_file(path)
    texts = [
        "First Citizen:\nBefore we proceed any further, hear me speak.",
        "don't I'LL you've 12345 x\t\ttabs  two spaces   three\r\n\n\nlines",
        "Unicode: caf\u00e9 and cafe\u0301 (one after NFC) \u6f22\u5b57 \U0001F600 \u00c5ngstr\u00f6m",
        "trailing spaces   ",
        "<|im_start|>user\nhello<|im_end|>",
        TORTURE,
        "",
    ]
    write_json(
        "qwen_style_expected.json",
        {"tokenizers_version": tokenizers.__version__, "vocab_size": tok.get_vocab_size(),
         "cases": cases_of(tok, texts)},
    )


if __name__ == "__main__":
    main()
