"""Requests the caller sees as one: parallel samples (SamplingParams.n > 1) and beam search.

Parallel sampling: the prompt is prefilled once by one request; when its logits
arrive, n - 1 samples fork its blocks (ref counts up, copy-on-write of the last
partial block on their first append) and each draws its first token from those
same logits with its own seed (seed + index), so sample i generates exactly what
a lone request with seed + i would. The caller holds one id; its StepOutputs
carry `index` 0..n-1 and `request(id).samples` lists the n Requests. Beam search
runs its beams the same way: a parent chosen twice forks, one not chosen is freed.

A plain request is a group of one member, so the engine keeps every request here.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .beam_search import BeamGroup, Hypothesis
from .grammar import grammar_matcher
from .request import Request, StepOutput
from .sampling import Sampler, SamplingParams
from .scheduler import Scheduler
from .tokenizer import StreamDecoder, Tokenizer


def new_sampler(params: SamplingParams, tokenizer: Tokenizer, stop_ids: frozenset[int]) -> Sampler:
    """The Sampler of one sequence; with a grammar, its own matcher (the tokenizer's vocabulary and the grammar's
    automaton and masks are cached and shared: pagedkv.grammar)."""
    if params.grammar is None:
        return Sampler(params)
    return Sampler(params, grammar_matcher(params.grammar, tokenizer, stop_ids))


@dataclass
class Member:
    """One unfinished request of a group, with what picks and streams its tokens."""

    request: Request
    sampler: Sampler
    decoder: StreamDecoder
    stop_ids: frozenset[int]
    group_id: str  # the id the caller holds (a sample's or a beam's own request id differs)
    fork_params: SamplingParams | None = None  # n > 1 and the samples not forked yet
    beam: BeamGroup | None = None


class SampleGroups:
    """Which requests belong to which caller's id, and the forks of parallel samples and beams."""

    def __init__(self, tokenizer: Tokenizer, ids=None) -> None:
        self.tokenizer = tokenizer
        self.members: dict[str, Member] = {}  # by the request's own id (a sample's or beam's: "<id>#<k>")
        self.roots: dict[str, Request] = {}  # the caller's id -> the request that prefills the prompt
        self.beams: dict[str, BeamGroup] = {}  # beam searches in flight
        self.finished_beams: dict[str, list[Hypothesis]] = {}  # until the caller takes them
        self._ids = ids if ids is not None else itertools.count()  # the engine's, shared by its models

    def new_id(self) -> int:
        """A number no request of this engine used (request ids "req-N" and beam forks share it)."""
        return next(self._ids)

    def add(self, member: Member) -> None:
        """Track the root request of a new group."""
        self.members[member.request.request_id] = member
        self.roots[member.group_id] = member.request
        if member.beam is not None:
            self.beams[member.group_id] = member.beam

    def in_use(self, group_id: str) -> bool:
        return group_id in self.members or group_id in self.roots

    def retire(self, scheduler: Scheduler, req: Request, reason: str) -> None:
        """A request is done (finished or pruned): free its blocks now; forget its group with its last member."""
        req.finish_reason = reason
        scheduler.remove(req)
        group_id = self.members.pop(req.request_id).group_id
        if not any(m.group_id == group_id for m in self.members.values()):
            self.roots.pop(group_id, None)

    def abort(self, scheduler: Scheduler, group_id: str) -> Request:
        """Stop every member of `group_id` now (blocks freed, output so far kept); returns its root."""
        members = [m.request for m in self.members.values() if m.group_id == group_id]
        if not members:
            raise KeyError(f"no unfinished request {group_id!r}")
        for req in members:
            del self.members[req.request_id]
            scheduler.remove(req)
            req.finish_reason = "abort"
        self.beams.pop(group_id, None)
        return self.roots.pop(group_id)

    def take_beam_results(self, group_id: str) -> list[Hypothesis]:
        """The final beams of a finished beam search, best first; handed over once (KeyError while it runs)."""
        results = self.finished_beams.pop(group_id, None)
        if results is None:
            raise KeyError(f"no finished beam search {group_id!r}")
        return results

    def fork_samples(self, scheduler: Scheduler, member: Member) -> list[Request]:
        """The requests that sample from the logits that just arrived: the request itself and, when these
        are its prompt's logits and n > 1, its n - 1 samples forked before anyone appends a token."""
        parent = member.request
        params = member.fork_params
        if params is None:
            return [parent]
        member.fork_params = None
        parent.samples = [parent]
        for i in range(1, params.n):
            child = scheduler.fork(parent, f"{parent.request_id}#{i}", i)
            sampler = new_sampler(params.for_sample(i), self.tokenizer, member.stop_ids)
            self.members[child.request_id] = Member(child, sampler, StreamDecoder(self.tokenizer), member.stop_ids,
                                                    member.group_id)
            parent.samples.append(child)
        return parent.samples

    def beam_steps(self, scheduler: Scheduler) -> list[StepOutput]:
        """Advance every beam search whose live beams all have their next-token log-probs."""
        results: list[StepOutput] = []
        for group in [g for g in self.beams.values() if g.ready]:
            results.extend(self._beam_step(scheduler, group))
        return results

    def _beam_step(self, scheduler: Scheduler, group: BeamGroup) -> list[StepOutput]:
        """Keep the best continuations. A parent chosen twice forks (before either appends), a parent not
        chosen is freed at once; a finished search frees all."""
        parents = list(group.beams)
        choices = group.advance()
        if group.results is not None:
            for req in parents:
                self.retire(scheduler, req, "beam")
            self.beams.pop(group.group_id)
            self.finished_beams[group.group_id] = group.results
            return [StepOutput(group.group_id, list(h.token_ids), self.tokenizer.decode(
                        [t for t in h.token_ids if t not in group.stop_ids]), True, h.finish_reason, index=i)
                    for i, h in enumerate(group.results)]
        owners: list[Request] = []
        kept: set[int] = set()
        for c in choices:
            if c.parent in kept:
                parent = parents[c.parent]
                child = scheduler.fork(parent, f"{group.group_id}#{self.new_id()}", 0)
                self.members[child.request_id] = Member(child, self.members[parent.request_id].sampler,
                                                        StreamDecoder(self.tokenizer), group.stop_ids,
                                                        group.group_id, beam=group)
                owners.append(child)
            else:
                kept.add(c.parent)
                owners.append(parents[c.parent])
        for i, req in enumerate(parents):
            if i not in kept:
                self.retire(scheduler, req, "pruned")
        for req, c in zip(owners, choices):
            req.append_token(c.token)
        group.beams = owners
        group.cum_logprobs = [c.cum_logprob for c in choices]
        return []
