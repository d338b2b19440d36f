"""GPT-2's byte-level BPE alphabet, shared by the tokenizer goldens, their tests and benchmarks.

Byte-level BPE (GPT-2, Qwen, Kimi, Ling) writes every byte of a token as one printable
character: the printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onwards,
in byte order. This is the table of Hugging Face tokenizers' ByteLevel pre-tokenizer (and of
GPT-2's `encoder.py`, `bytes_to_unicode`); written here once from that description.
"""


def bytes_to_unicode():
    """byte (0-255) -> the character byte-level BPE writes for it."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return dict(sorted(chars.items()))
