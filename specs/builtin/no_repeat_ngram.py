"""``no_repeat_ngram``: every token that would complete an n-gram the history already holds is masked,
exactly as transformers' ``NoRepeatNGramLogitsProcessor(size)`` on that history."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import Field, StrictBool, StrictInt, model_validator

from ..entry_base import EntryModel
from ..fast_base import FastModel
from ..kinds import ProcessorKind

__all__ = ["KIND", "MAX_NO_REPEAT_NGRAM_SIZE", "NoRepeatNgram", "NoRepeatNgramSpec"]

#: The longest n-gram an entry bans the repeats of. A row's index holds ``size - 1`` ids per token
#: of its history, and each new token costs ``size`` to index: the bound keeps both small. (Common
#: settings are 2 to 5: transformers' and TensorRT-LLM's ``no_repeat_ngram_size``.)
MAX_NO_REPEAT_NGRAM_SIZE = 32

#: What ``include_prompt`` with a scope other than ``always`` is refused with.
SCOPED_PROMPT_RULE = "include_prompt needs scope 'always': a scoped entry's history begins where its phase does, not after the prompt"


class NoRepeatNgramSpec(EntryModel):
    """At every step, each token that would complete an n-gram of ``size`` tokens already in the
    history is masked: the history is the output (``include_prompt: true``: the prompt, then the
    output). Placeholders (negative ids) in the history are never taken for tokens."""

    kind: Literal["no_repeat_ngram"] = "no_repeat_ngram"
    size: Annotated[StrictInt, Field(ge=1, le=MAX_NO_REPEAT_NGRAM_SIZE)]
    include_prompt: StrictBool = False

    @model_validator(mode="after")
    def _prompt_unscoped(self) -> NoRepeatNgramSpec:
        if self.include_prompt and self.scope != "always":
            raise ValueError(SCOPED_PROMPT_RULE)
        return self


class NoRepeatNgram(FastModel, tag="no_repeat_ngram", frozen=True):
    size: Annotated[int, msgspec.Meta(ge=1, le=MAX_NO_REPEAT_NGRAM_SIZE)]
    include_prompt: bool = False

    def passes_post_checks(self) -> bool:
        return not self.include_prompt or self.scope == "always"


KIND = ProcessorKind(
    kind="no_repeat_ngram", spec_model=NoRepeatNgramSpec, fast_model=NoRepeatNgram, builtin=True,
    factory="dynlogits.processors.no_repeat_ngram:factory",
    admission="dynlogits.specs.admission.no_repeat_ngram:RULES",
    reads_prompt=True,  # with include_prompt (a declaration is per kind: every entry's request is bounded)
)
