"""Whole hybrid models (docs/PYTHON.md, docs/MODEL.md): every family `hanpu run` takes (Qwen3.5
dense and MoE, Qwen3-Next, Kimi Linear, Ling 3.0), from a Hugging Face checkpoint directory or
with random weights of a preset's or a config.json's shapes.

    m = hanpu.Model.load("path/to/checkpoint")
    state = m.new_state()
    logits = m.forward(state, ids)               # [1, vocab] float32: the last token's
    out = m.generate(ids, max_new_tokens=32)     # greedy by default; the new ids
    tok = hanpu.Tokenizer.from_dir("path/to/checkpoint")
    print(tok.decode(out))

A state is per sequence and advances with every forward; `state.copy()` snapshots it (a prompt
prefix to continue from twice, for example). Forward calls release the GIL; two threads may run
two states through one model at once.
"""

import json
from pathlib import Path

from . import _hanpu
from .ops import get_num_threads

__all__ = ["Model", "ModelState", "Tokenizer", "WEIGHT_FORMATS"]

ModelState = _hanpu.ModelState
DEFAULT_INT8_GROUP = 64  # as hanpu::kDefaultInt8Group


# The names `weights` takes: the weight-format registry's (hanpu/weight_format.hpp), so a format
# added there is accepted here without a change.
WEIGHT_FORMATS = tuple(_hanpu.weight_load_names())


def _weights(weights, group):
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"`weights`: got {weights!r}, expected one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "int8" and (not isinstance(group, int) or group < 1):
        raise ValueError(f"`int8_group` must be a positive int, got {group!r}")
    return str(weights), int(group) if isinstance(group, int) and group >= 1 else DEFAULT_INT8_GROUP


class Model:
    """A loaded hybrid model. Use Model.load(dir) or Model.synthetic(preset_or_config_json)."""

    def __init__(self, impl):
        self._m = impl

    @classmethod
    def load(cls, path, weights="bf16", int8_group=DEFAULT_INT8_GROUP):
        """A checkpoint directory: config.json and model.safetensors (or an index with shards).
        `weights` is one of WEIGHT_FORMATS, as `hanpu run --weights`: "bf16" keeps the checkpoint's
        weights as stored, "int8" quantizes the projections at load (symmetric, one scale per
        int8_group inputs), "f16" converts them to f16, "q8_0" / "q4_k" / "q6_k" / "q4_k_m" quantize
        a safetensors checkpoint into that GGUF format at load (docs/MODEL.md "Weight formats").
        Raises hanpu.HanpuError naming the file and tensor for anything it cannot run."""
        m = cls(_hanpu._Model.load(str(path), *_weights(weights, int8_group)))
        m._dir = str(path)  # its tokenizer's stop ids for generate()
        return m

    @classmethod
    def synthetic(cls, spec, seed=1, weights="bf16", int8_group=DEFAULT_INT8_GROUP):
        """Random bf16 weights: `spec` is a preset name (as `hanpu bench-model --synthetic`) or the
        path of any family's config.json; weights as load's (the formats converted per tensor:
        bf16, int8, f16)."""
        return cls(_hanpu._Model.synthetic(str(spec), int(seed), get_num_threads(), *_weights(weights, int8_group)))

    @property
    def config(self):
        """model_type, sizes, layer_kinds (per layer: GDN, KDA, attention, MLA), eos ids, ..."""
        return self._m.config

    @property
    def weight_bytes(self):
        return self._m.weight_bytes

    def new_state(self):
        return self._m.new_state()

    def forward(self, state, ids, all_logits=False, precision="exact"):
        """Runs the token ids from `state` (advancing it) and returns float32 logits,
        [len(ids), vocab] with all_logits else [1, vocab]. precision: "exact" (f32 activations
        times bf16 weights), "bf16x2" or "bf16" (activations rounded as a bf16 model would), or
        "int8" (int8 weights only: decode activations quantized per group, int8 dot products on
        CPUs with AVX512-VNNI or AVX2; exact elsewhere and for prefill rows)."""
        return self._m.forward(state, ids, bool(all_logits), get_num_threads(), str(precision))

    def generate(self, ids, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop_ids=None,
                 state=None, prefill_chunk=None, stop_strings=(), tokenizer=None):
        """Prefills `ids` and samples up to max_new_tokens through hanpu's one generation path (the
        Generator `hanpu run` and `hanpu serve` use: same sampling, stop rules and prefill chunks
        of `prefill_chunk` tokens, default 256, so the same settings give the same tokens).
        Greedy with temperature 0. Stops after a token in stop_ids (default: the config's eos ids
        and, with a tokenizer, the chat end markers <|im_end|> and <|endoftext|>, as the CLI and
        server) or before a stop string (needs a tokenizer). `tokenizer`: a Tokenizer, or None to
        use the checkpoint's own when the model was loaded from a directory that has one.
        Returns the new ids (the stop token included, as before). `state`: continue from it
        (advanced in place) instead of a fresh one."""
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        if not ids:
            raise ValueError("`ids` is empty: generation needs at least one prompt token")
        if max_new_tokens < 0:
            raise ValueError(f"`max_new_tokens` must be >= 0, got {max_new_tokens}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"`prefill_chunk` must be >= 1, got {prefill_chunk}")
        tok = tokenizer if tokenizer is not None else self._tokenizer()
        st = self.new_state() if state is None else state
        tokens, (reason, stop_token) = _hanpu._generate(
            self._m, st, ids, tok._t if tok is not None else None, float(temperature), int(top_k), float(top_p), int(seed),
            int(max_new_tokens), None if stop_ids is None else [int(t) for t in stop_ids], [str(s) for s in stop_strings],
            int(prefill_chunk or _hanpu._DEFAULT_PREFILL_CHUNK), get_num_threads())
        return list(tokens) + ([stop_token] if stop_token is not None else [])

    def _tokenizer(self):
        d = getattr(self, "_dir", None)
        if d is None:
            return None
        if not hasattr(self, "_tok"):
            p = Path(d)
            self._tok = Tokenizer.from_dir(d) if (p / "tokenizer.json").exists() or (p / "tiktoken.model").exists() else None
        return self._tok

class Tokenizer:
    """A checkpoint's tokenizer: tokenizer.json (Qwen) or tiktoken.model (Kimi), and tokenizer_config.json."""

    def __init__(self, impl):
        self._t = impl

    @classmethod
    def from_dir(cls, path):
        t = cls(_hanpu._Tokenizer.from_dir(str(path)))
        t._dir = str(path)  # its chat template (apply_chat_template)
        return t

    @classmethod
    def from_file(cls, path):
        return cls(_hanpu._Tokenizer.from_file(str(path)))

    def encode(self, text, parse_special=True):
        return self._t.encode(text, bool(parse_special))

    def decode(self, ids, skip_special=False, errors="replace"):
        """Text of the ids; bytes that are not valid UTF-8 (a token cut inside a character) are
        decoded with `errors` ("replace", or "strict" to raise; decode_bytes gives the bytes)."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors=errors)

    def decode_bytes(self, ids, skip_special=False):
        return self._t.decode(ids, bool(skip_special))

    @property
    def vocab_size(self):
        return self._t.vocab_size

    @property
    def eos_token_id(self):
        return self._t.eos_token_id

    def token_to_id(self, token):
        return self._t.token_to_id(token)

    def apply_chat_template(self, messages, add_generation_prompt=True, enable_thinking=False, tools=None, **kwargs):
        """The checkpoint's own chat template (tokenizer_config.json's chat_template or
        chat_template.jinja, rendered by hanpu's Jinja subset as `hanpu serve` and `hanpu run
        --chat` render it: messages and tools as given, enable_thinking and `kwargs` as template
        variables) for a tokenizer loaded with from_dir; else Qwen's ChatML (roles
        system/user/assistant/tool, contents trimmed; messages are dicts with 'role' and
        'content'; no tools). Returns the text; encode() it."""
        d = getattr(self, "_dir", None)
        if d is not None:
            text = _hanpu._render_checkpoint_template(d, json.dumps(list(messages)), json.dumps(tools),
                                                     bool(add_generation_prompt),
                                                     json.dumps({"enable_thinking": bool(enable_thinking), **kwargs}))
            if text is not None:
                return text
        if tools:
            raise ValueError("`tools`: this tokenizer has no chat template, and the ChatML fallback renders no tools")
        return self._t.apply_chat_template(list(messages), bool(add_generation_prompt), bool(enable_thinking))
