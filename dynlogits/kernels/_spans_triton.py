"""The Triton kernels of ``spans.py`` (imported only by ``spans.kernels()``: importing this module
imports Triton). Contract and what checks it: ``dynlogits.kernels.spans``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["advance_rows", "drafts_rows", "restarted_advance_rows", "restarted_drafts_rows"]


@triton.jit
def _load_state(row_state, live):
    """A row's state columns (``KEY``, ``ANCHOR``, ``SEL``, ``OUT``)."""
    return (tl.load(row_state + 0, mask=live, other=0), tl.load(row_state + 1, mask=live, other=0),
            tl.load(row_state + 2, mask=live, other=0), tl.load(row_state + 3, mask=live, other=0))


@triton.jit
def _store_state(row_state, key, anchor, sel, out, live):
    tl.store(row_state + 0, key, mask=live)
    tl.store(row_state + 1, anchor, mask=live)
    tl.store(row_state + 2, sel, mask=live)
    tl.store(row_state + 3, out, mask=live)


@triton.jit
def _transition(base, hit, position, scale_ptr, key, anchor, sel, out, WIDTH: tl.constexpr):
    """The state after a transition at ``position`` where ``hit`` (``base``: the current state's
    constants), else as it is."""
    n_key = tl.load(base + WIDTH + 0, mask=hit, other=0) + position * tl.load(scale_ptr + 0).to(tl.int64)
    n_anchor = tl.load(base + WIDTH + 1, mask=hit, other=0) + position * tl.load(scale_ptr + 1).to(tl.int64)
    n_sel = tl.load(base + WIDTH + 2, mask=hit, other=0) + position * tl.load(scale_ptr + 2).to(tl.int64)
    n_out = tl.load(base + WIDTH + 3, mask=hit, other=0) + position * tl.load(scale_ptr + 3).to(tl.int64)
    return tl.where(hit, n_key, key), tl.where(hit, n_anchor, anchor), tl.where(hit, n_sel, sel), tl.where(hit, n_out, out)


@triton.jit
def _stretch(row_scope, row_prompt, live):
    """A row's stretch start (its scope state's ``ANCHOR``, never before the prompt's end) and
    whether the scope state is in the entry's phase (``OUT != 0``)."""
    start = tl.maximum(tl.load(row_scope + 1, mask=live, other=0), tl.load(row_prompt, mask=live, other=0).to(tl.int64))
    return start, live & (tl.load(row_scope + 3, mask=live, other=0) != 0)


@triton.jit
def _restart(row_restart, scale_ptr, start, redo, key, anchor, sel, out):
    """The state restarted at ``start`` (``row_restart`` plus ``start`` by ``scale``) where ``redo``."""
    r_key = tl.load(row_restart + 0, mask=redo, other=0) + start * tl.load(scale_ptr + 0).to(tl.int64)
    r_anchor = tl.load(row_restart + 1, mask=redo, other=0) + start * tl.load(scale_ptr + 1).to(tl.int64)
    r_sel = tl.load(row_restart + 2, mask=redo, other=0) + start * tl.load(scale_ptr + 2).to(tl.int64)
    r_out = tl.load(row_restart + 3, mask=redo, other=0) + start * tl.load(scale_ptr + 3).to(tl.int64)
    return (tl.where(redo, r_key, key), tl.where(redo, r_anchor, anchor), tl.where(redo, r_sel, sel),
            tl.where(redo, r_out, out))


@triton.jit
def _token_at(row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, at, live, HAS_FED: tl.constexpr):
    """A row's token at position ``at``: from the matrix (column clamped into the row) before
    ``committed``, else the fed draft (``HAS_FED``)."""
    column = tl.minimum(tl.maximum(at, 0), maxlen - 1)
    token = tl.load(row_tokens + column * tokens_s1, mask=live, other=0).to(tl.int64)
    if HAS_FED:
        index = tl.minimum(tl.maximum(first + at - committed + 1, 0), n_fed - 1)
        fed = tl.load(fed_ptr + index, mask=live, other=0).to(tl.int64)
        token = tl.where(at < committed, token, fed)
    return token


@triton.jit
def _decide(decided_ptr, r, live, valid, phase, count, anchor, sel, out, force_ptr, force_w, length, row_tokens, tokens_s1,
            maxlen, committed, fed_ptr, n_fed, first, CLOSED: tl.constexpr, NEVER: tl.constexpr, RULE: tl.constexpr,
            HAS_FED: tl.constexpr):
    """Store each row's decision by ``RULE`` at ``count`` (``PHRASE`` 1, ``DUE`` 2, ``STRETCH`` 3,
    ``FLOOR`` 4; see ``spans``' module doc); ``valid``: whether the row may be decided at all;
    ``phase``: whether a restart stage's scope is in the entry's phase (else ``-1``, whatever ``RULE``)."""
    span_len = count - anchor
    if RULE == 3:  # STRETCH: the stretch's count in phase
        fire = (out != 0) & valid & live
        tl.store(decided_ptr + r, tl.where(fire & phase, span_len, -1), mask=live)
    elif RULE == 4:  # FLOOR: the stretch's start in phase
        fire = (out != 0) & valid & live
        tl.store(decided_ptr + r, tl.where(phase, tl.where(fire, anchor, NEVER), -1), mask=live)
    else:
        _decide_forced(decided_ptr, r, live, valid & phase, count, span_len, anchor, sel, out, force_ptr, force_w, length,
                       row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, CLOSED, RULE, HAS_FED)


@triton.jit
def _decide_forced(decided_ptr, r, live, valid, count, span_len, anchor, sel, out, force_ptr, force_w, length,
                   row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, CLOSED: tl.constexpr,
                   RULE: tl.constexpr, HAS_FED: tl.constexpr):
    """``_decide`` by a rule that forces from ``force`` (``PHRASE``, ``DUE``)."""
    if RULE == 1:  # PHRASE
        fire = (sel == 1) & (anchor != CLOSED) & (span_len < length)
        at = tl.minimum(tl.maximum(span_len, 0), force_w - 1)
    else:  # DUE: past the leading force tokens the row already ends with
        fire = count >= out
        at = tl.zeros(count.shape, tl.int64)
        for k in range(1, force_w):
            match = live & (k < length) & (k <= span_len)
            for i in range(0, k):
                token = _token_at(row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, count - k + i, live,
                                  HAS_FED)
                match = match & (token == tl.load(force_ptr + i, mask=live, other=0))
            at = tl.where(match, k, at)
    fire = fire & valid & live
    token = tl.load(force_ptr + at, mask=fire, other=0)
    tl.store(decided_ptr + r, tl.where(fire, token, -1), mask=live)


@triton.jit(do_not_specialize=("state_s0", "consts_s0", "tokens_s0", "maxlen", "n", "rounds", "force_s0", "force_w",
            "flen_s0"), do_not_specialize_on_alignment=("state_ptr", "consts_ptr", "tokens_ptr", "total_ptr",
            "scale_ptr", "decided_ptr", "force_ptr", "flen_ptr"))
def advance_rows(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen, total_ptr,
                 scale_ptr, n, rounds, decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0,
                 WIDTH: tl.constexpr, BLOCK: tl.constexpr, BIG: tl.constexpr, CLOSED: tl.constexpr,
                 NEVER: tl.constexpr, RULE: tl.constexpr):
    """One program per ``BLOCK`` rows: every round of each row followed in registers, the state
    stored once, then the row's decision by ``RULE`` (see ``spans``' module doc)."""
    _advance(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen, total_ptr,
             scale_ptr, n, rounds, decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, state_ptr, 0,
             total_ptr, state_ptr, 0, total_ptr, WIDTH, BLOCK, BIG, CLOSED, NEVER, RULE, False)


@triton.jit(do_not_specialize=("state_s0", "consts_s0", "tokens_s0", "maxlen", "n", "rounds", "force_s0", "force_w",
            "flen_s0", "restart_s0", "scope_s0"), do_not_specialize_on_alignment=("state_ptr", "consts_ptr",
            "tokens_ptr", "total_ptr", "scale_ptr", "decided_ptr", "force_ptr", "flen_ptr", "restart_ptr", "epoch_ptr",
            "scope_ptr", "prompt_ptr"))
def restarted_advance_rows(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen,
                           total_ptr, scale_ptr, n, rounds, decided_ptr, force_ptr, force_s0, force_w, flen_ptr,
                           flen_s0, restart_ptr, restart_s0, epoch_ptr, scope_ptr, scope_s0, prompt_ptr,
                           WIDTH: tl.constexpr, BLOCK: tl.constexpr, BIG: tl.constexpr, CLOSED: tl.constexpr,
                           NEVER: tl.constexpr, RULE: tl.constexpr):
    """``advance_rows`` after the restart stage, deciding in the entry's phase only (``spans``'
    module doc)."""
    _advance(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen, total_ptr,
             scale_ptr, n, rounds, decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, restart_ptr,
             restart_s0, epoch_ptr, scope_ptr, scope_s0, prompt_ptr, WIDTH, BLOCK, BIG, CLOSED, NEVER, RULE, True)


@triton.jit
def _advance(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen, total_ptr,
             scale_ptr, n, rounds, decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, restart_ptr,
             restart_s0, epoch_ptr, scope_ptr, scope_s0, prompt_ptr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
             BIG: tl.constexpr, CLOSED: tl.constexpr, NEVER: tl.constexpr, RULE: tl.constexpr,
             RESTART: tl.constexpr):
    """The body of ``advance_rows`` (``RESTART``: after the restart stage)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    live = r < n
    row_state = state_ptr + r * state_s0
    key, anchor, sel, out = _load_state(row_state, live)
    in_phase = live
    if RESTART:
        start, in_phase = _stretch(scope_ptr + r * scope_s0, prompt_ptr + r, live)
        key, anchor, sel, out = _restart(restart_ptr + r * restart_s0, scale_ptr, start,
                                         live & (tl.load(epoch_ptr + r, mask=live, other=0) != start),
                                         key, anchor, sel, out)
        tl.store(epoch_ptr + r, start, mask=live)
    total = tl.load(total_ptr + r, mask=live, other=0).to(tl.int64)
    row_consts = consts_ptr + r * consts_s0
    row_tokens = tokens_ptr + r * tokens_s0
    for i in range(0, rounds):
        back = rounds - 1 - i
        position = total - back
        base = row_consts + sel * (WIDTH + 4)
        matches = tl.zeros([BLOCK], tl.int64)
        for k in tl.static_range(WIDTH):
            column = position - WIDTH + k
            column = tl.where(column < 0, column + maxlen, column)  # torch's negative index
            column = tl.minimum(tl.maximum(column, 0), maxlen - 1)  # a catch-up round's clamp at -max_len
            token = tl.load(row_tokens + column * tokens_s1, mask=live, other=0).to(tl.int64)
            wanted = tl.load(base + k, mask=live, other=0)
            matches += (token == wanted).to(tl.int64)
        hit = live & (BIG * matches + position >= key)
        key, anchor, sel, out = _transition(base, hit, position, scale_ptr, key, anchor, sel, out, WIDTH)
    _store_state(row_state, key, anchor, sel, out, live)
    if RULE != 0:
        length = tl.load(flen_ptr + r * flen_s0, mask=live, other=0)
        _decide(decided_ptr, r, live, live, in_phase, total, anchor, sel, out, force_ptr + r * force_s0, force_w,
                length, row_tokens, tokens_s1, maxlen, total, force_ptr, 1, r, CLOSED, NEVER, RULE, False)


@triton.jit
def _seen(row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, i, live, WIDTH: tl.constexpr,
          PAD: tl.constexpr, HAS_FED: tl.constexpr):
    """Column ``i`` of a row's tokens: its last ``WIDTH`` committed ones (a negative column read from
    the row's end, as torch indexing), then the drafts fed after them (``PAD`` without any)."""
    column = committed - WIDTH + i
    column = tl.where(column < 0, column + maxlen, column)
    column = tl.minimum(tl.maximum(column, 0), maxlen - 1)
    committed_token = tl.load(row_tokens + column * tokens_s1, mask=live & (i < WIDTH), other=0).to(tl.int64)
    if HAS_FED:
        at = tl.minimum(tl.maximum(first + i - WIDTH + 1, 0), n_fed - 1)
        fed = tl.load(fed_ptr + at, mask=live & (i >= WIDTH), other=0).to(tl.int64)
    else:
        fed = tl.full(committed.shape, PAD, tl.int64)
    return tl.where(i < WIDTH, committed_token, fed)


@triton.jit(do_not_specialize=("state_s0", "consts_s0", "tokens_s0", "nslots", "maxlen", "n_fed", "rows", "later",
            "out_s0", "force_s0", "force_w", "flen_s0"), do_not_specialize_on_alignment=("state_ptr", "consts_ptr",
            "tokens_ptr", "total_ptr", "scale_ptr", "slots_ptr", "member_ptr", "fed_ptr", "local_ptr", "out_ptr",
            "valid_ptr", "decided_ptr", "force_ptr", "flen_ptr"))
def drafts_rows(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, nslots, maxlen,
                total_ptr, scale_ptr, slots_ptr, member_ptr, fed_ptr, n_fed, local_ptr, rows, later, out_ptr, out_s0,
                valid_ptr, decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, WIDTH: tl.constexpr,
                BLOCK: tl.constexpr, BIG: tl.constexpr, CLOSED: tl.constexpr, NEVER: tl.constexpr, PAD: tl.constexpr,
                PLACEHOLDER: tl.constexpr, RULE: tl.constexpr, HAS_FED: tl.constexpr):
    """One program per ``BLOCK`` rows: each row's slot state followed over the drafts before it in
    registers, stored per row with whether it may be decided and its decision by ``RULE`` (see
    ``spans``' module doc)."""
    _drafts(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, nslots, maxlen, total_ptr,
            scale_ptr, slots_ptr, member_ptr, fed_ptr, n_fed, local_ptr, rows, later, out_ptr, out_s0, valid_ptr,
            decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, state_ptr, 0, total_ptr, out_ptr, 0,
            total_ptr, WIDTH, BLOCK, BIG, CLOSED, NEVER, PAD, PLACEHOLDER, RULE, HAS_FED, False)


@triton.jit(do_not_specialize=("state_s0", "consts_s0", "tokens_s0", "nslots", "maxlen", "n_fed", "rows", "later",
            "out_s0", "force_s0", "force_w", "flen_s0", "restart_s0", "scope_s0"),
            do_not_specialize_on_alignment=("state_ptr", "consts_ptr", "tokens_ptr", "total_ptr", "scale_ptr",
            "slots_ptr", "member_ptr", "fed_ptr", "local_ptr", "out_ptr", "valid_ptr", "decided_ptr", "force_ptr",
            "flen_ptr", "restart_ptr", "epoch_ptr", "scope_ptr", "prompt_ptr"))
def restarted_drafts_rows(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, nslots,
                          maxlen, total_ptr, scale_ptr, slots_ptr, member_ptr, fed_ptr, n_fed, local_ptr, rows, later,
                          out_ptr, out_s0, valid_ptr, decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0,
                          restart_ptr, restart_s0, epoch_ptr, scope_ptr, scope_s0, prompt_ptr, WIDTH: tl.constexpr,
                          BLOCK: tl.constexpr, BIG: tl.constexpr, CLOSED: tl.constexpr, NEVER: tl.constexpr,
                          PAD: tl.constexpr, PLACEHOLDER: tl.constexpr, RULE: tl.constexpr, HAS_FED: tl.constexpr):
    """``drafts_rows`` with each row's slot state restarted at its scope row's stretch first,
    deciding in the entry's phase only (``spans``' module doc)."""
    _drafts(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, nslots, maxlen, total_ptr,
            scale_ptr, slots_ptr, member_ptr, fed_ptr, n_fed, local_ptr, rows, later, out_ptr, out_s0, valid_ptr,
            decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, restart_ptr, restart_s0, epoch_ptr,
            scope_ptr, scope_s0, prompt_ptr, WIDTH, BLOCK, BIG, CLOSED, NEVER, PAD, PLACEHOLDER, RULE, HAS_FED, True)


@triton.jit
def _drafts(state_ptr, state_s0, consts_ptr, consts_s0, tokens_ptr, tokens_s0, tokens_s1, nslots, maxlen, total_ptr,
            scale_ptr, slots_ptr, member_ptr, fed_ptr, n_fed, local_ptr, rows, later, out_ptr, out_s0, valid_ptr,
            decided_ptr, force_ptr, force_s0, force_w, flen_ptr, flen_s0, restart_ptr, restart_s0, epoch_ptr,
            scope_ptr, scope_s0, prompt_ptr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, BIG: tl.constexpr,
            CLOSED: tl.constexpr, NEVER: tl.constexpr, PAD: tl.constexpr, PLACEHOLDER: tl.constexpr,
            RULE: tl.constexpr, HAS_FED: tl.constexpr, RESTART: tl.constexpr):
    """The body of ``drafts_rows`` (``RESTART``: each row restarted first)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    live = r < rows
    slot = tl.load(slots_ptr + r, mask=live, other=0).to(tl.int64)
    clamped = tl.minimum(slot, nslots - 1)
    committed = tl.load(total_ptr + clamped, mask=live, other=0).to(tl.int64)
    drafts = tl.load(local_ptr + r, mask=live, other=0).to(tl.int64)
    first = r - drafts
    key, anchor, sel, out = _load_state(state_ptr + slot * state_s0, live)
    in_phase = live
    if RESTART:
        start, in_phase = _stretch(scope_ptr + r * scope_s0, prompt_ptr + clamped, live)
        key, anchor, sel, out = _restart(restart_ptr + slot * restart_s0, scale_ptr, start,
                                         live & (tl.load(epoch_ptr + slot, mask=live, other=0) != start),
                                         key, anchor, sel, out)
    row_consts = consts_ptr + slot * consts_s0
    row_tokens = tokens_ptr + clamped * tokens_s0
    valid = tl.load(member_ptr + r, mask=live, other=0) != 0
    for j in range(1, later + 1):
        fresh = live & (j <= drafts)
        if HAS_FED:
            valid = valid & ~(fresh & (_seen(row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first,
                                             WIDTH + j - 1, live, WIDTH, PAD, HAS_FED) == PLACEHOLDER))
        position = committed + j
        base = row_consts + sel * (WIDTH + 4)
        matches = tl.zeros([BLOCK], tl.int64)
        for k in tl.static_range(WIDTH):
            token = _seen(row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, j + k, live, WIDTH, PAD,
                          HAS_FED)
            matches += (token == tl.load(base + k, mask=live, other=0)).to(tl.int64)
        hit = fresh & (BIG * matches + position >= key)
        key, anchor, sel, out = _transition(base, hit, position, scale_ptr, key, anchor, sel, out, WIDTH)
    _store_state(out_ptr + r * out_s0, key, anchor, sel, out, live)
    tl.store(valid_ptr + r, valid, mask=live)
    if RULE != 0:
        length = tl.load(flen_ptr + slot * flen_s0, mask=live, other=0)
        _decide(decided_ptr, r, live, valid, in_phase, committed + drafts, anchor, sel, out, force_ptr + slot * force_s0,
                force_w, length, row_tokens, tokens_s1, maxlen, committed, fed_ptr, n_fed, first, CLOSED, NEVER, RULE,
                HAS_FED)
