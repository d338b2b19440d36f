"""The small byte-level BPE tokenizer the Qwen model goldens ship (make_qwen35_golden.py,
make_qwen3next_golden.py): trained with the tokenizers library on a few lines, with the model
family's NFC normalizer, split regex and ByteLevel pre-tokenizer/decoder, plus Qwen's special
tokens at the end of the vocabulary."""

import json
import os


def build_tokenizer(out_dir, split_regex, corpus, vocab, special_tokens):
    """Writes tokenizer.json and tokenizer_config.json to out_dir; returns {special token: id}."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(special_tokens)
    assert tok.get_vocab_size() <= vocab, tok.get_vocab_size()
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "model_max_length": 4096}, f, indent=2)
        f.write("\n")
    return {t: tok.token_to_id(t) for t in special_tokens}
