"""The executor's copy of each running request's block table, kept up to date from the
changes the scheduler sends (whole tables once, appended blocks afterwards)."""
from __future__ import annotations

from lenserve_contract.errors import InvalidRequestError
from services.executor.types import ExecutorInput


class BlockTables:
    def __init__(self):
        self._tables: dict[str, list[int]] = {}

    def resolve(self, batch: ExecutorInput) -> list[list[int]]:
        """Each sequence's full table after this batch's changes, without storing anything
        (a batch refused later must leave the cache as it was)."""
        dropped = set(batch.finished_request_ids)
        tables = []
        for seq in batch.sequences:
            if seq.host_block_table is not None:       # streamed: host blocks, sent whole
                tables.append(list(seq.host_block_table))
                continue
            if not seq.block_table_is_delta:
                tables.append(list(seq.block_table))
                continue
            known = None if seq.request_id in dropped else self._tables.get(seq.request_id)
            if known is None:
                raise InvalidRequestError(
                    f"request {seq.request_id!r} sends a block-table delta but the executor "
                    "holds no table for it; send the whole table", field="block_table")
            # Tables are never changed in place, so an empty delta shares the stored list.
            tables.append(known + seq.block_table if seq.block_table else known)
        return tables

    def commit(self, batch: ExecutorInput, tables: list[list[int]]) -> None:
        for rid in batch.finished_request_ids:
            self._tables.pop(rid, None)
        for seq, table in zip(batch.sequences, tables):
            if seq.host_block_table is None:
                self._tables[seq.request_id] = table
            else:
                self._tables.pop(seq.request_id, None)

    def __len__(self) -> int:
        return len(self._tables)
