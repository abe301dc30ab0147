"""Parallel sampling (``n > 1``): one request, ``n`` sequences on one prefill of its prompt.

The request becomes ``n`` child requests in the scheduler, ``<id>#n<i>`` for choice ``i``;
the first, the *leader*, is queued at once. The others are held back until the leader has
computed the prompt's full blocks (``shared_tokens``: every full block before the last
prompt token), which the prefix cache then indexes; released, each child is admitted like
any request and claims those blocks from the index, sharing them with the leader through the
block manager's reference counts. So the prompt's full blocks are prefilled once, and
preempting, swapping or finishing one child only drops its own hold on them.

The last, partial prompt block is *recomputed* by each child rather than copied: at most
``block_size`` tokens per child, it needs no block-copy operation in the executor (local or
remote) and no copy-on-write, and it gives each child its own logits for its first token,
sampled with its own seed. A prompt without a full block before its last token, or an
engine with prefix caching off, shares nothing: the children are queued at once and each
prefills the prompt.

Seeds: child 0 keeps the request's ``seed`` (so it samples what ``n = 1`` would), child
``i`` gets ``seed + i * 0x9E3779B97F4A7C15 mod 2**63``; without a seed each child draws
fresh entropy. Children share the request's arrival time and its one length prediction
(asked once, for the leader), so a policy ranks them next to each other; each is admitted,
preempted and swapped on its own.

Outputs: every child's output becomes a ``CompletionOutput`` with ``index = i`` of the
parent's ``RequestOutput``: with deltas, the choices that changed; without, every choice so
far. The parent is finished when every child is; aborting the parent aborts them all."""
from __future__ import annotations

import dataclasses

from lenserve_contract.outputs import CompletionOutput, RequestOutput
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.request import Request

CHILD_MARK = "#n"
_MIX = 0x9E3779B97F4A7C15


def child_id(parent_id: str, index: int) -> str:
    return f"{parent_id}{CHILD_MARK}{index}"


def child_seed(seed: int | None, index: int) -> int | None:
    if seed is None or index == 0:
        return seed
    return (seed + index * _MIX) % 2 ** 63


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    return dataclasses.replace(params, n=1, seed=child_seed(params.seed, index))


def shared_tokens(num_prompt_tokens: int, block_size: int, caching: bool) -> int:
    """Prompt tokens the children take from the leader's blocks (full blocks before the
    last prompt token, whose logits every child needs)."""
    return (num_prompt_tokens - 1) // block_size * block_size if caching else 0


class Group:
    __slots__ = ("children", "delta", "done", "error", "held", "latest", "parent_id",
                 "shared_tokens")

    def __init__(self, parent_id: str, children: list[Request], shared: int, delta: bool):
        self.parent_id, self.children, self.shared_tokens = parent_id, children, shared
        self.delta = delta
        self.held: list[Request] = children[1:] if shared else []
        self.latest: list[CompletionOutput | None] = [None] * len(children)
        self.done = [False] * len(children)
        self.error: str | None = None

    @property
    def leader(self) -> Request:
        return self.children[0]

    @property
    def finished(self) -> bool:
        return all(self.done)

    def output(self, items: list[tuple[int, RequestOutput]]) -> RequestOutput:
        first = items[0][1]
        for i, out in items:
            completion = out.outputs[0]
            completion.index = i
            self.latest[i] = completion
            self.done[i] = self.done[i] or out.finished
            self.error = self.error or out.error
        finished = self.finished
        if self.delta:
            choices = sorted((out.outputs[0] for _, out in items), key=lambda c: c.index)
        else:
            choices = [c for c in self.latest if c is not None]
        metrics = self.leader.metrics
        if finished:
            ends = [c.metrics.finished_time for c in self.children
                    if c.metrics.finished_time is not None]
            metrics = dataclasses.replace(metrics, finished_time=max(ends, default=None))
        return RequestOutput(self.parent_id, first.prompt, first.prompt_token_ids, choices,
                             finished, metrics, self.error)


class ParallelGroups:
    """The engine's requests with ``n > 1``: their children, held and released, and the
    merge of the children's outputs into their parent's."""

    def __init__(self):
        self.by_parent: dict[str, Group] = {}
        self._child: dict[str, tuple[Group, int]] = {}
        self._holding: list[Group] = []

    def __contains__(self, parent_id: str) -> bool:
        return parent_id in self.by_parent

    def owns(self, request_id: str) -> bool:
        """A parent's or a child's id (no other request may take it meanwhile)."""
        return request_id in self.by_parent or request_id in self._child

    @property
    def num_held(self) -> int:
        return sum(len(g.held) for g in self._holding)

    def add(self, group: Group) -> None:
        self.by_parent[group.parent_id] = group
        for i, child in enumerate(group.children):
            self._child[child.request_id] = (group, i)
        if group.held:
            self._holding.append(group)

    def siblings(self, request_id: str) -> list[Request]:
        """The other children of a leader (for its prediction); [] for any other id."""
        entry = self._child.get(request_id)
        if entry is None or entry[1] != 0:
            return []
        return entry[0].children[1:]

    def release_ready(self, enqueue, everything_of: str | None = None) -> None:
        """Queue the held children of every group whose leader has computed the shared blocks
        (or finished), through ``enqueue(request)``; ``everything_of``: that parent's now."""
        keep = []
        for group in self._holding:
            leader = group.leader
            if (group.parent_id == everything_of or leader.is_finished
                    or leader.num_computed_tokens >= group.shared_tokens):
                held, group.held = group.held, []
                for child in held:
                    enqueue(child)
            else:
                keep.append(group)
        self._holding = keep

    def merge(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Children's outputs -> one output per parent (others pass through)."""
        if not self._child:
            return outputs
        merged, touched = [], {}
        for out in outputs:
            entry = self._child.get(out.request_id)
            if entry is None:
                merged.append(out)
                continue
            group, i = entry
            touched.setdefault(group.parent_id, (group, []))[1].append((i, out))
        for group, items in touched.values():
            out = group.output(items)
            if out.finished:
                self._forget(group)
            merged.append(out)
        return merged

    def _forget(self, group: Group) -> None:
        del self.by_parent[group.parent_id]
        for child in group.children:
            self._child.pop(child.request_id, None)
