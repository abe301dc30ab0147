"""The length DB: one Qdrant collection per served model of (prompt embedding → real length).

Near-identical prompts are merged into one point, so repeated traffic refines a length
instead of crowding the top-k. Every point's payload says where its length came from:
`observed` true for the served model's own completions, false for points seeded from a data
set (another model's replies), and keeps the text its vector was embedded from (`text`), so
that the DB can be embedded again by an encoder refitted to the served model (refit.py).
The collection is bounded; eviction drops seeded points before observed ones, and the least
recently seen first.
"""
from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

import numpy as np
from qdrant_client import QdrantClient, models

from services.predictor.config import StoreConfig
from services.predictor.embedder import STOCK_ENCODER_ID
from services.predictor.mirror import SearchMirror


@dataclass(frozen=True)
class Neighbours:
    scores: np.ndarray  # (k,) cosine similarities, best first
    lengths: np.ndarray  # (k,) stored lengths
    observed: np.ndarray  # (k,) bool: the served model's own completion, not seed data


EMPTY = Neighbours(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, bool))


@dataclass(frozen=True)
class StoredRecords:
    ids: list[str]
    texts: list[str | None]  # what each point's vector was embedded from (None: not kept)
    lengths: np.ndarray
    observed: np.ndarray
    last_seen: np.ndarray


@dataclass(frozen=True)
class UpsertResult:
    ids: list[str]  # per record, the point it created or merged into
    created: int  # new points
    newly_observed: int  # points that became observed: new ones, or seeded ones overwritten
    evicted: int = 0  # points dropped to keep the collection bounded


def open_client(config: StoreConfig) -> QdrantClient:
    if config.qdrant_url:
        return QdrantClient(url=config.qdrant_url, timeout=5, check_compatibility=False)
    return QdrantClient(location=":memory:") if config.qdrant_path == ":memory:" \
        else QdrantClient(path=config.qdrant_path)


def collection_name(prefix: str, model: str) -> str:
    # Model names hold '/', ':' and dots; the hash keeps two names that sanitise alike apart.
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", model)[:48]
    return f"{prefix}__{safe}_{hashlib.sha1(model.encode()).hexdigest()[:8]}"


class LengthStore:
    def __init__(self, config: StoreConfig, dim: int, client: QdrantClient | None = None,
                 encoder: str = STOCK_ENCODER_ID):
        self.config = config
        self.dim = dim
        # Vectors of two encoders are not comparable: every point is tagged with its encoder.
        self.encoder = encoder
        self.client = client or open_client(config)
        self._known: set[str] = set()
        # Embedded mode only: searched in-process (see mirror.py); built on first search.
        self._mirrors: dict[str, SearchMirror] | None = None if config.qdrant_url else {}

    def close(self) -> None:
        self.client.close()

    def _collection(self, model: str, create: bool) -> str | None:
        name = collection_name(self.config.collection_prefix, model)
        if name in self._known:
            return name
        if self.client.collection_exists(name):
            size = self.client.get_collection(name).config.params.vectors.size
            if size != self.dim:
                # e.g. a DB built with head-only embeddings opened with head+tail ones.
                raise ValueError(f"collection {name} holds {size}-d vectors, the embedder gives "
                                 f"{self.dim}-d ones; rebuild the DB with this embedder config")
            points, _ = self.client.scroll(name, limit=1, with_payload=["encoder"])
            # Points written before the tag existed were all made by the stock encoder.
            built = points[0].payload.get("encoder", STOCK_ENCODER_ID) if points else self.encoder
            if built != self.encoder:
                raise ValueError(f"collection {name} was built with encoder {built!r}, the "
                                 f"embedder is {self.encoder!r}; rebuild the DB with this encoder "
                                 f"or serve with the one that built it (--encoder)")
            self._known.add(name)
            return name
        if not create:
            return None
        self.client.create_collection(
            name, vectors_config=models.VectorParams(size=self.dim, distance=models.Distance.COSINE))
        self._known.add(name)
        return name

    def has_model(self, model: str) -> bool:
        return self._collection(model, create=False) is not None

    def models(self) -> list[str]:
        out = []
        for c in self.client.get_collections().collections:
            if not c.name.startswith(self.config.collection_prefix + "__"):
                continue
            points, _ = self.client.scroll(c.name, limit=1, with_payload=["model"])
            if points:
                out.append(points[0].payload["model"])
        return sorted(out)

    def count(self, model: str, observed: bool | None = None) -> int:
        """Points of a model; only observed (True) or only seeded (False) ones if told."""
        name = self._collection(model, create=False)
        if name is None:
            return 0
        if observed is None:
            return self.client.count(name, exact=True).count
        if self._mirrors is not None:  # embedded Qdrant filters in Python: seconds per count
            flags = self._mirror(name).observed
            return int(flags.sum() if observed else (~flags).sum())
        match = models.FieldCondition(key="observed", match=models.MatchValue(value=observed))
        return self.client.count(name, count_filter=models.Filter(must=[match]),
                                 exact=True).count

    def search(self, model: str, vectors: np.ndarray, k: int) -> list[Neighbours]:
        name = self._collection(model, create=False)
        if name is None or len(vectors) == 0:
            return [EMPTY] * len(vectors)
        if self._mirrors is not None:
            mirror = self._mirror(name)
            return [Neighbours(scores, mirror.lengths[idx], mirror.observed[idx])
                    for scores, idx in mirror.search(vectors, k)]
        requests = [models.QueryRequest(query=v.tolist(), limit=k,
                                        with_payload=["length", "observed"]) for v in vectors]
        responses = self.client.query_batch_points(name, requests=requests)
        return [Neighbours(np.array([p.score for p in r.points], np.float32),
                           np.array([p.payload["length"] for p in r.points], np.float32),
                           np.array([bool(p.payload.get("observed")) for p in r.points], bool))
                for r in responses]

    def upsert(self, model: str, vectors: np.ndarray, lengths: np.ndarray, now: float,
               observed: bool = True, texts: list[str] | None = None) -> UpsertResult:
        """Add records, merging near-duplicates. ``texts``: what each vector was embedded
        from, kept with a new point (a merged point keeps its own)."""
        if texts is not None and len(texts) != len(vectors):
            raise ValueError(f"{len(vectors)} vectors but {len(texts)} texts")
        name = self._collection(model, create=True)
        nearest = self._nearest(name, vectors)
        points: dict[str, models.PointStruct] = {}
        # Rows created so far in this batch, filled in place: stacking a growing list for
        # every record made a large batch (a seed of thousands) quadratic.
        pending_vecs = np.empty_like(vectors)
        pending_ids: list[str] = []
        ids, created, newly_observed = [], 0, 0
        for i, vec in enumerate(vectors):
            target = self._merge_target(vec, nearest[i], pending_vecs[:len(pending_ids)],
                                        pending_ids, points)
            if target is None:
                pid = str(uuid.uuid4())
                payload = {"model": model, "length": float(lengths[i]), "count": 1,
                           "last_seen": now, "observed": observed, "encoder": self.encoder}
                if texts is not None:
                    payload["text"] = texts[i]
                points[pid] = models.PointStruct(id=pid, vector=vec.tolist(), payload=payload)
                pending_vecs[len(pending_ids)] = vec
                pending_ids.append(pid)
                created += 1
                newly_observed += observed
            else:
                pid, point = target
                newly_observed += observed and not point.payload.get("observed", False)
                point.payload = merge_payload(point.payload, float(lengths[i]), now, observed,
                                              self.config.merge_min_weight)
                points[pid] = point
            ids.append(pid)
        if points:
            self.client.upsert(name, points=list(points.values()))
            if self._mirrors is not None and name in self._mirrors:
                self._mirrors[name].apply(points.values())
        evicted = self._evict(name)
        return UpsertResult(ids, created, int(newly_observed), evicted)

    def _nearest(self, name: str, vectors: np.ndarray) -> list:
        """Per vector, its nearest stored point (payload and vector) or None."""
        if self._mirrors is None:
            requests = [models.QueryRequest(query=v.tolist(), limit=1, with_payload=True,
                                            with_vector=True) for v in vectors]
            return [r.points[0] if r.points else None
                    for r in self.client.query_batch_points(name, requests=requests)]
        # Embedded: the mirror finds the candidates in microseconds, and only those close
        # enough to merge are read back from Qdrant.
        mirror = self._mirror(name)
        hits = [(float(s[0]), mirror.ids[int(i[0])]) if len(s) else None
                for s, i in mirror.search(vectors, 1)]
        close = [hit[1] for hit in hits if hit and hit[0] >= self.config.merge_threshold]
        found = {str(p.id): p for p in self.client.retrieve(
            name, ids=close, with_payload=True, with_vectors=True)} if close else {}
        return [models.ScoredPoint(id=hit[1], version=0, score=hit[0],
                                   payload=found[hit[1]].payload, vector=found[hit[1]].vector)
                if hit and hit[1] in found else None for hit in hits]

    def _merge_target(self, vec, hit, pending_vecs, pending_ids, points):
        # Duplicates inside one batch must merge with each other, not only with the DB.
        if len(pending_vecs):
            sims = pending_vecs @ vec
            j = int(np.argmax(sims))
            if sims[j] >= self.config.merge_threshold:
                return pending_ids[j], points[pending_ids[j]]
        if hit is None or hit.score < self.config.merge_threshold:
            return None
        pid = str(hit.id)
        if pid in points:
            return pid, points[pid]
        return pid, models.PointStruct(id=pid, vector=list(hit.vector), payload=dict(hit.payload))

    def _evict(self, name: str) -> int:
        bound = self.config.max_points_per_model
        n = self.client.count(name, exact=True).count
        if n <= bound:
            return 0
        keep = int(bound * self.config.evict_to_fraction)
        rows = self._scroll(name, with_vectors=False, fields=["observed", "last_seen"])
        rows.sort(key=lambda p: (bool(p.payload.get("observed")), p.payload.get("last_seen", 0.0)))
        victims = [p.id for p in rows[: n - keep]]
        self.client.delete(name, points_selector=models.PointIdsList(points=victims))
        if self._mirrors is not None:
            self._mirrors.pop(name, None)  # eviction is rare; rebuilt on the next search
        return len(victims)

    def _scroll(self, name: str, with_vectors: bool, fields) -> list:
        out, offset = [], None
        while True:
            batch, offset = self.client.scroll(name, limit=1024, offset=offset,
                                               with_payload=fields, with_vectors=with_vectors)
            out.extend(batch)
            if offset is None:
                return out

    def _mirror(self, name: str) -> SearchMirror:
        if name not in self._mirrors:
            rows = self._scroll(name, with_vectors=True, fields=["length", "observed"])
            self._mirrors[name] = SearchMirror(
                [str(p.id) for p in rows], np.array([p.vector for p in rows], np.float32),
                np.array([p.payload["length"] for p in rows]),
                np.array([bool(p.payload.get("observed")) for p in rows], bool))
        return self._mirrors[name]

    def records(self, model: str) -> StoredRecords:
        """Every point's id, text (None where none was kept), length, observed flag and when
        it was last seen."""
        name = self._collection(model, create=False)
        rows = [] if name is None else self._scroll(
            name, with_vectors=False, fields=["text", "length", "observed", "last_seen"])
        return StoredRecords([str(p.id) for p in rows], [p.payload.get("text") for p in rows],
                             np.array([p.payload["length"] for p in rows], np.float32),
                             np.array([bool(p.payload.get("observed")) for p in rows], bool),
                             np.array([p.payload.get("last_seen", 0.0) for p in rows], float))

    def revector(self, model: str, vectors: dict[str, np.ndarray], encoder: str) -> int:
        """Give every point of a model its vector from ``encoder``: ``vectors`` by point id
        must cover them all (the caller holds writers off). Payloads stay as they are now,
        with the new encoder's tag; returns the points rewritten."""
        name = self._collection(model, create=False)
        if name is None:
            return 0
        rows = self._scroll(name, with_vectors=False, fields=True)
        missing = [str(p.id) for p in rows if str(p.id) not in vectors]
        if missing:
            raise ValueError(f"{len(missing)} points of {model!r} have no new vector")
        for start in range(0, len(rows), 1024):
            self.client.upsert(name, points=[
                models.PointStruct(id=p.id, vector=np.asarray(vectors[str(p.id)]).tolist(),
                                   payload={**p.payload, "encoder": encoder})
                for p in rows[start:start + 1024]])
        if self._mirrors is not None:
            self._mirrors.pop(name, None)  # rebuilt from the new vectors on the next search
        return len(rows)

    def export(self, model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All (vectors, lengths, observed flags) of a model, for training the MLP."""
        name = self._collection(model, create=False)
        rows = [] if name is None else self._scroll(name, with_vectors=True,
                                                    fields=["length", "observed"])
        if not rows:
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32), \
                np.zeros(0, bool)
        vectors = np.array([p.vector for p in rows], dtype=np.float32)
        # Point ids are random, and so is the scroll's order: sorted by vector, the same
        # contents train the same MLP (its shuffles are seeded), run after run.
        order = stable_order(vectors)
        return (vectors[order],
                np.array([p.payload["length"] for p in rows], dtype=np.float32)[order],
                np.array([bool(p.payload.get("observed")) for p in rows], bool)[order])


def stable_order(vectors: np.ndarray) -> np.ndarray:
    """An order of rows that depends on the vectors alone, not on point ids or scroll order:
    the same contents then train the same MLP (its shuffles are seeded)."""
    return np.lexsort(vectors[:, :8].T[::-1])


def merge_payload(old: dict, length: float, now: float, observed: bool, min_w: float) -> dict:
    """The merged record of a near-duplicate prompt."""
    if observed and not old.get("observed", False):
        # The served model's own completion outranks a length seeded from a dataset.
        return {**old, "length": length, "count": 1, "last_seen": now, "observed": True}
    count = int(old.get("count", 1))
    w = max(1.0 / (count + 1), min_w)
    merged = float(old["length"]) + w * (length - float(old["length"]))
    return {**old, "length": merged, "count": count + 1, "last_seen": now,
            "observed": bool(old.get("observed")) or observed}
