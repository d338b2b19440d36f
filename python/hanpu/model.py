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

from . import _hanpu
from .ops import get_num_threads

__all__ = ["Model", "ModelState", "Tokenizer"]

ModelState = _hanpu.ModelState
DEFAULT_INT8_GROUP = 64  # as hanpu::kDefaultInt8Group


def _int8_group(weights, group):
    if weights not in ("bf16", "int8"):
        raise ValueError(f"`weights` must be 'bf16' or 'int8', got {weights!r}")
    if weights == "int8" and (not isinstance(group, int) or group < 1):
        raise ValueError(f"`int8_group` must be a positive int, got {group!r}")
    return int(group) if weights == "int8" else 0


class Model:
    """A loaded hybrid model. Use Model.load(dir) or Model.synthetic(preset_or_config_json)."""

    def __init__(self, impl):
        self._m = impl

    @classmethod
    def load(cls, path, weights="bf16", int8_group=DEFAULT_INT8_GROUP):
        """A checkpoint directory: config.json and model.safetensors (or an index with shards).
        weights="int8" quantizes the projections at load (symmetric, one scale per int8_group
        inputs; as `hanpu run --weights int8`). Raises hanpu.HanpuError naming the file and tensor
        for anything it cannot run."""
        return cls(_hanpu._Model.load(str(path), _int8_group(weights, int8_group)))

    @classmethod
    def synthetic(cls, spec, seed=1, weights="bf16", int8_group=DEFAULT_INT8_GROUP):
        """Random bf16 weights: `spec` is a preset name (as `hanpu bench-model --synthetic`) or the
        path of any family's config.json; weights as load's."""
        return cls(_hanpu._Model.synthetic(str(spec), int(seed), get_num_threads(), _int8_group(weights, int8_group)))

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
                 state=None, prefill_chunk=None):
        """Prefills `ids` (in chunks of `prefill_chunk` tokens if given) and samples up to
        max_new_tokens; greedy with temperature 0. Stops after a token in stop_ids (default: the
        config's eos ids). Returns the new ids (the stop token included, as `hanpu run` prints it).
        `state`: continue from it (advanced in place) instead of a fresh one."""
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        if not ids:
            raise ValueError("`ids` is empty: generation needs at least one prompt token")
        if max_new_tokens < 0:
            raise ValueError(f"`max_new_tokens` must be >= 0, got {max_new_tokens}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"`prefill_chunk` must be >= 1, got {prefill_chunk}")
        stop = set(self.config["eos_token_ids"] if stop_ids is None else stop_ids)
        sampler = _hanpu._Sampler(float(temperature), int(top_k), float(top_p), int(seed))
        st = self.new_state() if state is None else state
        step = prefill_chunk or len(ids)
        for i in range(0, len(ids), step):
            logits = self.forward(st, ids[i:i + step])
        out = []
        for _ in range(max_new_tokens):
            nxt = sampler.sample(logits[0])
            out.append(nxt)
            if nxt in stop or len(out) == max_new_tokens:
                break
            logits = self.forward(st, [nxt])
        return out


class Tokenizer:
    """A checkpoint's tokenizer: tokenizer.json (Qwen) or tiktoken.model (Kimi), and tokenizer_config.json."""

    def __init__(self, impl):
        self._t = impl

    @classmethod
    def from_dir(cls, path):
        return cls(_hanpu._Tokenizer.from_dir(str(path)))

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

    def apply_chat_template(self, messages, add_generation_prompt=True, enable_thinking=False):
        """Qwen's ChatML template (roles system/user/assistant/tool, contents trimmed); messages
        are dicts with 'role' and 'content'. Returns the text; encode() it."""
        return self._t.apply_chat_template(list(messages), bool(add_generation_prompt), bool(enable_thinking))
