"""What each load request asks for and what its answer must be.

Every request is planned up front from its index, so a run is reproducible and each answer can be
checked against its own expectation:

* ``forced``: ``forced_text`` with a text unique to the request; the answer must be exactly it.
* ``bias``: ``logit_bias`` +100 on token A, greedy; the answer must be A repeated ``max_tokens`` times.
* ``banned``: bias A +100 and B +90, ban A, greedy; the answer must be B repeated (the ban wins).
* ``none``: no spec; any complete answer is right unless it carries another request's forced text.

``bias`` and ``banned`` need two single-token words of the served model (:class:`TokenPair`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["KINDS", "Endpoint", "Kind", "Mix", "Plan", "TokenPair", "build_plans", "load_token_pair"]

Kind = Literal["forced", "banned", "bias", "none"]
Endpoint = Literal["chat", "completion"]
KINDS: tuple[Kind, ...] = ("forced", "banned", "bias", "none")
#: Single-token words of the embedded model's tokenizer, tried in order.
_CANDIDATE_WORDS = (" the", " and", " of", " to", " a", " is")


@dataclass(frozen=True)
class TokenPair:
    """Two distinct single-token words of the served model (``a`` is biased, ``b`` the fallback)."""

    a_id: int
    a_text: str
    b_id: int
    b_text: str


@dataclass(frozen=True)
class Mix:
    """Relative weights of the request kinds, e.g. ``forced=2,banned=1,bias=1,none=1``."""

    weights: tuple[tuple[Kind, int], ...]

    @classmethod
    def parse(cls, text: str) -> Mix:
        """``"forced=2,none=1"`` -> a mix; ``ValueError`` naming the bad item."""
        weights: dict[Kind, int] = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, _, value = item.partition("=")
            if name not in KINDS:
                raise ValueError(f"--mix: unknown kind {name!r} (expected one of {list(KINDS)})")
            try:
                weight = int(value or "1")
            except ValueError:
                raise ValueError(f"--mix: {item!r}: the weight must be an integer") from None
            if weight < 0:
                raise ValueError(f"--mix: {item!r}: the weight must be >= 0")
            weights[name] = weight
        if not any(weights.values()):
            raise ValueError("--mix: at least one kind needs a weight > 0")
        return cls(tuple((k, w) for k, w in weights.items() if w > 0))

    def cycle(self) -> list[Kind]:
        """One period of the kinds, interleaved (``forced, banned, forced, bias, ...``) so that
        consecutive requests differ."""
        slots: list[tuple[float, Kind]] = []
        for kind, weight in self.weights:
            slots += [((i + 0.5) / weight, kind) for i in range(weight)]
        return [k for _, k in sorted(slots, key=lambda s: s[0])]

    @property
    def needs_tokens(self) -> bool:
        return any(k in ("banned", "bias") for k, _ in self.weights)


@dataclass(frozen=True)
class Plan:
    """One request: where it goes, what it sends, what must come back (``expected=None``: anything)."""

    index: int
    kind: Kind
    endpoint: Endpoint
    stream: bool
    max_tokens: int
    entries: tuple[dict[str, Any], ...]
    expected: str | None

    @property
    def forced_text(self) -> str | None:
        return self.expected if self.kind == "forced" else None

    def request(self, model: str) -> dict[str, Any]:
        """Keyword arguments for ``client.chat.completions.create`` / ``client.completions.create``."""
        kwargs: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "temperature": 0.0}
        if self.endpoint == "chat":
            kwargs["messages"] = [{"role": "user", "content": f"Load request {self.index}."}]
        else:
            kwargs["prompt"] = f"Load request {self.index}:"
        if self.entries:
            kwargs["extra_body"] = {"logits_processors": [dict(e) for e in self.entries]}
        if self.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        return kwargs


def _plan(index: int, kind: Kind, *, stream: bool, max_tokens: int, tokens: TokenPair | None) -> Plan:
    endpoint: Endpoint = "chat" if (index // 2) % 2 == 0 else "completion"
    if kind == "forced":
        text = f"ok {index}."
        entries: tuple[dict[str, Any], ...] = ({"kind": "forced_text", "text": text},)
        # The forced text ends with EOS; the token budget only guards against a broken processor.
        return Plan(index, kind, endpoint, stream, max(max_tokens, 16), entries, text)
    if kind == "none":
        return Plan(index, kind, endpoint, stream, max_tokens, (), None)
    if tokens is None:
        raise ValueError(f"kind {kind!r} needs the served model's tokenizer (--tokenizer DIR)")
    if kind == "bias":
        entries = ({"kind": "logit_bias", "bias": {str(tokens.a_id): 100.0}},)
        return Plan(index, kind, endpoint, stream, max_tokens, entries, tokens.a_text * max_tokens)
    entries = ({"kind": "logit_bias", "bias": {str(tokens.a_id): 100.0, str(tokens.b_id): 90.0}},
               {"kind": "banned_tokens", "token_ids": [tokens.a_id]})
    return Plan(index, kind, endpoint, stream, max_tokens, entries, tokens.b_text * max_tokens)


def build_plans(count: int, mix: Mix, *, stream_share: float, max_tokens: int, tokens: TokenPair | None,
                start: int = 0) -> list[Plan]:
    """``count`` plans with indices ``start..``: kinds follow ``mix``, and a ``stream_share`` fraction
    of each kind streams (spread evenly, so every kind is seen both ways)."""
    kinds = itertools.cycle(mix.cycle())
    plans: list[Plan] = []
    for index in range(start, start + count):
        stream = int((index + 1) * stream_share) != int(index * stream_share)
        plans.append(_plan(index, next(kinds), stream=stream, max_tokens=max_tokens, tokens=tokens))
    return plans


def load_token_pair(tokenizer_dir: str | Path) -> TokenPair:
    """Two single-token words from ``tokenizer_dir/tokenizer.json`` (a Hugging Face fast tokenizer)."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"--tokenizer: {path} does not exist")
    tokenizer = Tokenizer.from_file(str(path))
    found: list[tuple[int, str]] = []
    for word in _CANDIDATE_WORDS:
        ids = tokenizer.encode(word, add_special_tokens=False).ids
        if len(ids) == 1 and tokenizer.decode(ids) == word:
            found.append((ids[0], word))
        if len(found) == 2:
            (a_id, a_text), (b_id, b_text) = found
            return TokenPair(a_id, a_text, b_id, b_text)
    raise ValueError(f"--tokenizer: fewer than two of {list(_CANDIDATE_WORDS)} are single tokens in {path}")
