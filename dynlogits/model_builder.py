"""The embedded default model: a tiny random-weight Llama with a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on the small corpus below,
so any text round-trips exactly; the weights are random with a fixed seed, so the outputs mean
nothing but are deterministic (tests force them with specs). The model folder is in Hugging Face
format and loads with ``vllm.LLM(model=dir)`` and ``transformers.AutoTokenizer``.

The *reasoning* variant (``build_model(dir, reasoning=True)``) adds ``<think>`` and ``</think>`` as
one token each (kept in decoded text, as DeepSeek-R1's and Qwen3's are), a DeepSeek-R1-style chat
template whose generation prompt ends with ``<think>\n``, and ``REASONING_FILE``: the model's
default reasoning delimiters, which a worker serving it reads (``model_reasoning``).

Heavy libraries (torch, tokenizers, safetensors) are imported only inside the functions that
build, so ``import dynlogits.model_builder`` stays light.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["MAX_VOCAB_SIZE", "REASONING_FILE", "build_model", "default_model_dir", "model_reasoning"]

#: Largest logits width ``build_model`` accepts.
MAX_VOCAB_SIZE = 262144
#: Bumped whenever the builder's output changes, so stale folders are rebuilt.
BUILDER_VERSION = 1

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, START_HEADER, END_HEADER)
THINK_START = "<think>"
THINK_END = "</think>"
#: A model folder's default reasoning delimiters (``{"start_text": ..., "end_text": ...}`` or token
#: ids), in the form of a ``reasoning`` entry without its kind.
REASONING_FILE = "dynlogits_reasoning.json"

_TOKENIZER_VOCAB = 1000
_MARKER = "dynlogits_model.json"
_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json", "special_tokens_map.json", _MARKER)

# Llama-3 style turns; every turn ends with the EOS token, so one EOS id ends generation everywhere.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# DeepSeek-R1 style: an assistant turn's reasoning is dropped from the history, and the generation
# prompt opens a reasoning span (generation starts inside it).
REASONING_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set content = message['content'].split('</think>')[-1] if message['role'] == 'assistant' else message['content'] %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + content + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n<think>\\n' }}{% endif %}"
)

_ARCH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM CPU attention needs a head size >= 32
    "max_position_embeddings": 2048,
}

_CORPUS = """\
Hello world! Hello, world. Hello there, how are you today? I am fine, thank you. And you?
Yes. No. Maybe. Yes, please. No, thank you. Okay, that is fine with me.
The quick brown fox jumps over the lazy dog. The dog did not move; it was sleeping in the sun.
A model reads a prompt and writes an answer, one token at a time, until it reaches the end.
The answer is yes. The answer is no. The answer is forty-two. Is the answer correct? It is.
What is your name? My name is Ada. Where do you live? I live in a small house near the river.
When will the train arrive? The train will arrive at nine o'clock in the morning, not at night.
Why is the sky blue? Because light from the sun is scattered by the air, and blue light most of all.
Please write a short story about a cat who wanted to fly. Once upon a time there was a cat.
She looked at the birds every day and said: "One day I will fly too." Her friends laughed at her.
But the cat did not give up. She climbed the tallest tree in the garden and jumped.
She did not fly, of course, but she landed softly on the grass, and she was happy anyway.
The end. Thank you for reading. Good morning, good afternoon, good evening and good night!
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 100 256 1000 2024 3.14 -1 +7 50% $5 #1 @home
Punctuation: , . ; : ! ? ' " ( ) [ ] { } < > / \\ | - _ = + * & ^ % $ # @ ~ `
Code: def main(argv): return 0; for i in range(10): print(i, end=", "); x = {"key": [1, 2, 3]}
JSON: {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, true, false, null.
The user asks a question and the assistant gives a helpful, honest and short answer.
The system message tells the assistant how to behave. Be concise. Be correct. Be kind.
Red, green, blue, yellow, orange, purple, black, white, gray, brown and pink are colours.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week.
January, February, March, April, May, June, July, August, September, October, November, December.
One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, hundred, thousand.
We went to the market to buy bread, milk, eggs, cheese, apples, rice, tea and coffee.
The weather is nice today: warm and sunny, with a light wind. Tomorrow it may rain again.
Learning is a journey. Ask questions, read books, make mistakes, and try again and again.
This is a test. This is only a test. If this were a real answer, it would be more useful.
Stop. Start. Continue. Repeat after me: hello, hello, hello. Goodbye, see you later!
Unicode: café, naïve, façade, résumé, über, señor, jalapeño, Zürich, São Paulo, Kraków.
Emoji and symbols: 🙂 😀 👍 ❤ ★ ✓ → ← ≤ ≥ ≠ ∞ € £ ¥ © ° ± × ÷ µ.
Other scripts: Привет мир. Γειά σου κόσμε. こんにちは世界. 你好，世界. مرحبا بالعالم. שלום עולם.
"""


def _tokenizer(reasoning: bool = False) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``_CORPUS`` (deterministic); with
    ``reasoning``, ``<think>`` and ``</think>`` follow as one added token each."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TOKENIZER_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)]
        ),
    ])
    if reasoning:  # after training: every other id stays the default model's
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    return tok


def _weights(vocab_size: int, seed: int) -> dict[str, Any]:
    """Random float32 Llama weights (HF names), N(0, 0.02) matrices and unit norms, from ``seed``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, i, d = _ARCH["hidden_size"], _ARCH["intermediate_size"], _ARCH["head_dim"]
    q, kv = _ARCH["num_attention_heads"] * d, _ARCH["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, h)}
    for layer in range(_ARCH["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (vocab_size, h)}
    return {
        name: torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * 0.02
        for name, shape in shapes.items()
    }


def _params(vocab_size: int | None, seed: int, reasoning: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"builder_version": BUILDER_VERSION, "vocab_size": vocab_size, "seed": seed}
    if reasoning:  # only then: the default model's marker (and folder) stay as they were
        params["reasoning"] = True
    return params


def _is_complete(path: Path, params: dict[str, Any]) -> bool:
    """True if ``path`` holds every model file and a marker recording exactly ``params``."""
    try:
        marker = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    files = (*_FILES, REASONING_FILE) if params.get("reasoning") else _FILES
    return marker.get("params") == params and all((path / f).is_file() for f in files)


def _check_args(vocab_size: int | None, seed: int) -> None:
    if vocab_size is not None and (not isinstance(vocab_size, int) or isinstance(vocab_size, bool)):
        raise ValueError(f"vocab_size must be an integer or None, got {vocab_size!r}")
    if vocab_size is not None and not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be between the tokenizer size and {MAX_VOCAB_SIZE}, got {vocab_size}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_model(tmp: Path, vocab_size: int | None, seed: int, reasoning: bool = False) -> None:
    """Writes every model file into the empty folder ``tmp``; the marker last."""
    from safetensors.torch import save_file

    tok = _tokenizer(reasoning)
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and vocab_size < n_tokens:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer ({n_tokens} tokens); "
                         f"it must be in [{n_tokens}, {MAX_VOCAB_SIZE}]")
    width = vocab_size if vocab_size is not None else (n_tokens // 64 + 1) * 64  # always padded past the tokenizer
    bos_id, eos_id, pad_id = (tok.token_to_id(t) for t in (BOS, EOS, PAD))

    tok.save(str(tmp / "tokenizer.json"))
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    _write_json(tmp / "special_tokens_map.json", specials)
    _write_json(tmp / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": _ARCH["max_position_embeddings"],
        "chat_template": REASONING_CHAT_TEMPLATE if reasoning else CHAT_TEMPLATE,
    })
    if reasoning:
        _write_json(tmp / REASONING_FILE, {"start_text": THINK_START, "end_text": THINK_END})
    _write_json(tmp / "config.json", {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_ARCH,
        "vocab_size": width,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    })
    _write_json(tmp / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id})
    save_file(_weights(width, seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    _write_json(tmp / _MARKER, {"params": _params(vocab_size, seed, reasoning), "tokenizer_size": n_tokens,
                                "vocab_size": width})


def _make_readable(folder: Path) -> None:
    """Makes ``folder`` (``mkdtemp`` makes it private) and its files world-readable, like a download."""
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o644)


def build_model(out_dir: str | os.PathLike[str], *, vocab_size: int | None = None, seed: int = 0,
                reasoning: bool = False) -> Path:
    """Builds the model folder ``out_dir`` and returns it as a resolved ``Path``.

    ``reasoning``: the reasoning variant (see the module doc); the same weights and the same ids for
    every other token as without it.

    ``vocab_size`` is the logits width (config ``vocab_size``, embedding and lm_head rows); it must lie
    in ``[len(tokenizer), MAX_VOCAB_SIZE]``. ``None`` means the tokenizer size rounded up past the next
    multiple of 64, so there are always logits with no token. Same arguments give byte-identical files.

    Atomic: the folder is built beside ``out_dir`` and renamed into place, so a crash never leaves a half
    model. Returns at once if ``out_dir`` already holds a complete model built with the same arguments;
    replaces one built with other arguments; refuses (``ValueError``) a non-empty folder it did not build.
    Raises ``ValueError`` for bad arguments, naming the argument. Downloads nothing.
    """
    _check_args(vocab_size, seed)
    out = Path(out_dir).expanduser().resolve()
    params = _params(vocab_size, seed, reasoning)
    if _is_complete(out, params):
        return out
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / _MARKER).is_file())):
        raise ValueError(f"{out} exists and is not a dynlogits model folder; refusing to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        _write_model(tmp, vocab_size, seed, reasoning)
        _make_readable(tmp)
        old = None
        if _is_complete(out, params):  # a concurrent builder finished first
            return out
        if out.exists():  # an empty folder or one of ours built with other arguments: move it aside
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "model")
        try:
            os.rename(tmp, out)
        except OSError:
            if not _is_complete(out, params):  # not a concurrent builder that won the race
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_model_dir() -> Path:
    """The embedded default model folder, built on first use (thread- and process-safe).

    ``$DYNLOGITS_MODEL_DIR`` if set, else ``~/.cache/dynlogits/default-model-v1``. Concurrent callers
    serialize on an ``fcntl.flock`` lock file beside the folder; only one builds, the others wait.
    """
    import fcntl

    env = os.environ.get("DYNLOGITS_MODEL_DIR")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "dynlogits" / "default-model-v1"
    path = path.resolve()
    params = _params(None, 0)
    if _is_complete(path, params):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _is_complete(path, params):
                print(f"dynlogits: building the embedded default model in {path} (one-time, a few seconds)",
                      file=sys.stderr, flush=True)
                build_model(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


def model_reasoning(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The default reasoning delimiters a model folder declares in ``REASONING_FILE`` (a reasoning
    entry's fields: ``start_text``/``end_text`` or ``start_token_ids``/``end_token_ids``), or ``None``
    when it declares none (or ``model_dir`` is not a local folder, e.g. a hub name). Unchecked: the
    caller validates it as a ``reasoning`` entry."""
    path = Path(model_dir).expanduser() / REASONING_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with the reasoning delimiters, got {type(data).__name__}")
    return data
