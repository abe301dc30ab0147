"""`python -m services.predictor` / `lenserve predictor serve|build`: CLI → frozen config.

The offline eval (`lenserve predictor eval`) lives in `evaluation.predictor`, above this
package: it reuses the flags and helpers here, and nothing here imports it."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time

from services.predictor.config import EmbedderConfig, MLPConfig, PredictorConfig, StoreConfig
from services.predictor.embedder import PRECISIONS
from services.predictor.encoder_build import (
    add_finetune_args,
    build_finetune_epochs,
    copy_encoder_beside,
    encoder_beside_db,
    fine_tune,
)

log = logging.getLogger("lenserve.predictor")
DEFAULT_PORT = 50053  # documented default; override with --port or LENSERVE_PREDICTOR_PORT


def add_common(p: argparse.ArgumentParser, threads: int = 0) -> None:
    """Flags every predictor command shares; `threads` is the --threads default: 1 for the
    service (it shares its host with the other services, where one thread per call beats
    threads spinning on stolen cores), 0 (every core) for the offline build and eval."""
    g = p.add_argument_group("predictor")
    g.add_argument("--qdrant-path", default=os.environ.get("LENSERVE_QDRANT_PATH", ":memory:"),
                   help="embedded Qdrant: ':memory:' or a directory that persists")
    g.add_argument("--qdrant-url", default=os.environ.get("LENSERVE_QDRANT_URL"),
                   help="a Qdrant server instead of embedded mode")
    g.add_argument("--model", default="default", help="served model whose DB is used")
    g.add_argument("--encoder", default=os.environ.get("LENSERVE_PREDICTOR_ENCODER"),
                   help="sentence-transformers model directory (default: the encoder `build "
                        "--finetune-epochs` left beside --qdrant-path, else all-MiniLM-L6-v2)")
    g.add_argument("--max-seq-length", type=int, default=0,
                   help="encoder tokens per prompt (0: a fine-tuned encoder's own window, else "
                        "32; with --finetune-epochs, the window to train, default 64)")
    g.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="encoder arithmetic (auto: bf16 on CPUs with native bf16, else fp32)")
    g.add_argument("--padded-passes", action="store_true",
                   help="run the encoder on padded batches, as sentence-transformers and "
                        "transformers do, instead of on each batch's real tokens only (the "
                        "same vectors, slower; fine-tuning too)")
    g.add_argument("--threads", type=int, default=threads,
                   help=f"torch threads (0 = torch's default, every core; default {threads})")
    g.add_argument("--top-k", type=int, default=8)
    g.add_argument("--similarity-threshold", type=float, default=0.8, help="ALISE s0")
    g.add_argument("--blend-width", type=float, default=0.1,
                   help="blend retrieval into the MLP from s0 down to s0 minus this (0 = switch)")
    g.add_argument("--tail-chars", type=int, default=0,
                   help="also embed a prompt's last N characters (0 = head only)")
    g.add_argument("--mlp-ensemble", type=int, default=3, help="MLPs averaged (seeds)")
    g.add_argument("--refit-first", type=int, default=250,
                   help="refit the encoder to the served model's replies once this many were "
                        "observed, then whenever they doubled (0 = never)")
    g.add_argument("--refit-epochs", type=int, default=2, help="epochs of each refit")
    g.add_argument("--refit-dir", default=os.environ.get("LENSERVE_REFIT_DIR"),
                   help="where refitted encoders are kept (default: beside an on-disk "
                        "--qdrant-path, else a temporary directory); serve starts from the "
                        "last one there")
    g.add_argument("--max-points", type=int, default=50_000, help="DB bound per model")
    g.add_argument("--observed-parity", type=int, default=PredictorConfig.observed_parity,
                   help="observed completions that weigh as much as all the seed data in the "
                        "MLP's training (a seed neighbour then weighs half an observed one) "
                        "until the seed's weight is learnt")
    g.add_argument("--seed-weight-min-records", type=int,
                   default=PredictorConfig.seed_weight_min_records,
                   help="completions with seed and observed neighbours after which a seed "
                        "neighbour weighs what they show it is worth (0 = never: the "
                        "--observed-parity curve)")


def refit_dir(args) -> str | None:
    """--refit-dir, else beside an on-disk Qdrant directory, else None (a temporary one)."""
    if getattr(args, "refit_dir", None):
        return args.refit_dir
    beside = encoder_beside_db(args.qdrant_path, args.qdrant_url)
    return beside and beside + "-refit"


def resolve_encoder(args) -> str | None:
    """--encoder, else the encoder the DB's vectors were last refitted with, else the encoder
    build fine-tuned beside the DB, else stock MiniLM (None)."""
    from services.predictor.refit import current_refit

    if args.encoder:
        return args.encoder
    refitted = current_refit(refit_dir(args))
    if refitted:
        return refitted
    beside = encoder_beside_db(args.qdrant_path, args.qdrant_url)
    return beside if beside and os.path.isdir(beside) else None


def config_from_args(args) -> PredictorConfig:
    return PredictorConfig(
        embedder=EmbedderConfig(resolve_encoder(args), args.max_seq_length,
                                num_threads=args.threads, packed=not args.padded_passes,
                                precision=args.precision, tail_chars=args.tail_chars),
        mlp=MLPConfig(ensemble=args.mlp_ensemble), blend_width=args.blend_width,
        store=StoreConfig(qdrant_path=args.qdrant_path, qdrant_url=args.qdrant_url,
                          max_points_per_model=args.max_points),
        default_model=args.model, top_k=args.top_k,
        similarity_threshold=args.similarity_threshold,
        observed_parity=args.observed_parity,
        seed_weight_min_records=args.seed_weight_min_records,
        retrain_every=getattr(args, "retrain_every", 1000),
        refit_first=_refit_first(args), refit_epochs=args.refit_epochs,
        refit_dir=refit_dir(args))


def _refit_first(args) -> int:
    # A Qdrant server keeps its vectors across restarts; the encoder that made them must be
    # kept as well, so refits there need a directory that lasts.
    if args.refit_first > 0 and args.qdrant_url and not refit_dir(args):
        log.info("encoder refits off: a Qdrant server outlives a temporary directory; name "
                 "one with --refit-dir (LENSERVE_REFIT_DIR) to refit")
        return 0
    return args.refit_first


def mlp_path(config: PredictorConfig, model: str) -> str | None:
    """Where build leaves the MLP of a model for serve: beside an on-disk Qdrant directory."""
    if config.store.qdrant_path == ":memory:" or config.store.qdrant_url:
        return None
    from services.predictor.store import collection_name

    return os.path.join(config.store.qdrant_path + "-mlp", collection_name("mlp", model) + ".npz")


def load_or_train_mlps(predictor) -> None:
    for model in predictor.store.models():
        path = mlp_path(predictor.config, model)
        try:
            if path and os.path.exists(path):
                predictor.load_mlp(model, path)
            else:
                predictor.retrain(model)
        except ValueError as exc:
            log.info("no MLP for %s yet: %s", model, exc)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_common(p, threads=1)
    # Loopback unless told otherwise: exposing the service is a deployment decision.
    p.add_argument("--host", default=os.environ.get("LENSERVE_PREDICTOR_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int,
                   default=int(os.environ.get("LENSERVE_PREDICTOR_PORT", DEFAULT_PORT)))
    p.add_argument("--kafka-bootstrap", default=os.environ.get("LENSERVE_KAFKA_BOOTSTRAP"))
    p.add_argument("--kafka-topic", default="completions")
    p.add_argument("--celery-broker", default=os.environ.get("LENSERVE_CELERY_BROKER"))
    p.add_argument("--retrain-dir", default=os.environ.get("LENSERVE_RETRAIN_DIR"),
                   help="directory shared with the Celery worker for DB snapshots and weights "
                        "(default: a fresh temporary directory, enough for a worker on this host)")
    p.add_argument("--retrain-every", type=int, default=1000,
                   help="retrain the MLP at least every this many new observed completions "
                        "(earlier while few were observed; 0 = never automatically)")
    p.add_argument("--retrain-interval-s", type=float, default=0.0,
                   help="also retrain periodically (0 = off)")
    p.add_argument("--seed-data", metavar="bundled|FILE|none",
                   default=os.environ.get("LENSERVE_PREDICTOR_SEED", "none"),
                   help="the prior of a --model the DB holds nothing for yet: the bundled 2,000 "
                        "ShareGPT prompts and reply lengths, a JSON-lines file of {prompt, "
                        "output_len}, or none (learn from served requests only)")


def _start_kafka(args, predictor, stop: threading.Event) -> threading.Thread | None:
    if not args.kafka_bootstrap:
        return None

    def loop() -> None:
        from services.predictor.kafka_bus import CompletionConsumer, ensure_topic

        # An unreachable broker is retried, never fatal: Observe over gRPC still works.
        while not stop.is_set():
            try:
                ensure_topic(args.kafka_bootstrap, args.kafka_topic)
                consumer = CompletionConsumer(args.kafka_bootstrap, predictor.observe,
                                              topic=args.kafka_topic)
                consumer.run(stop)
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - any broker failure is retried
                log.error("Kafka at %s unavailable (%s); retrying in 5 s",
                          args.kafka_bootstrap, exc)
                stop.wait(5.0)
    thread = threading.Thread(target=loop, name="kafka-completions", daemon=True)
    thread.start()
    return thread


def _periodic_retrain(predictor, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        for model in predictor.store.models():
            try:
                predictor._trigger_retrain(model)
            except Exception as exc:  # noqa: BLE001 - a failed retrain must not stop the timer
                log.warning("periodic retrain of %s failed: %s", model, exc)


async def serve_async(args) -> int:
    from services.predictor.core import Predictor
    from services.predictor.learning import ThreadRetrainer
    from services.predictor.servicer import build_server, mark_serving

    from services.predictor import tasks

    config = config_from_args(args)
    predictor = Predictor(config)
    # Retraining never runs on the Observe path: in a Celery worker, else in a thread.
    predictor.retrain_hook = ThreadRetrainer(predictor)
    if args.celery_broker:
        tasks.configure(args.celery_broker)
        if args.retrain_dir:
            os.makedirs(args.retrain_dir, exist_ok=True)
        predictor.retrain_hook = tasks.CeleryRetrainer(predictor, workdir=args.retrain_dir)
    try:  # a DB built with another encoder or width: refuse to start, say why
        for model in predictor.store.models():
            predictor.store.has_model(model)
    except ValueError as exc:
        log.error("cannot serve this DB: %s", exc)
        predictor.store.close()
        return 2
    load_or_train_mlps(predictor)
    if not seed_if_empty(predictor, args):
        predictor.store.close()
        return 2
    server, port = build_server(predictor, f"{args.host}:{args.port}")
    await server.start()
    await mark_serving(server)
    stop = threading.Event()
    _start_kafka(args, predictor, stop)
    if args.retrain_interval_s > 0:
        threading.Thread(target=_periodic_retrain, args=(predictor, args.retrain_interval_s, stop),
                         daemon=True).start()
    log.info("predictor serving on %s:%d (models: %s)", args.host, port, predictor.store.models())
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    stop.set()
    await server.stop(grace=5)
    predictor.close()
    return 0


def seed_if_empty(predictor, args) -> bool:
    """Seed --model from --seed-data unless the DB already holds it (a DB that outlives a
    restart, on disk or in a Qdrant server, is seeded once). False: the seed is unreadable."""
    from services.predictor.local import seed_core

    if args.seed_data == "none" or args.model in predictor.store.models():
        return True
    path = None if args.seed_data == "bundled" else args.seed_data
    try:
        count = seed_core(predictor, args.model, path)
    except (OSError, ValueError) as exc:
        log.error("cannot seed from %s: %s", args.seed_data, exc)
        return False
    log.info("seeded %s with %d records from %s", args.model, count, args.seed_data)
    return True


def serve(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(serve_async(args))


def add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset-name", required=True, choices=["sharegpt", "alpaca"])
    p.add_argument("--dataset-path", required=True)
    p.add_argument("--tokenizer", default=None, help="served model's tokenizer (default MiniLM)")
    p.add_argument("--num-train", type=int, default=2000)
    p.add_argument("--num-test", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)


def load_split(args):
    from services.predictor import datasets

    samples = datasets.load(args.dataset_name, args.dataset_path)
    train, test = datasets.split(samples, args.num_train, args.num_test, args.seed)
    return train, test, datasets.load_tokenizer(args.tokenizer)


def build(args) -> int:
    from services.predictor import datasets, mlp
    from services.predictor.core import Predictor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = dataclasses.replace(config_from_args(args), retrain_every=0)
    train, _, tokenizer = load_split(argparse.Namespace(**{**vars(args), "num_test": 0}))
    lengths = datasets.count_tokens(tokenizer, [s.reply for s in train])
    t0 = time.perf_counter()
    epochs = build_finetune_epochs(args, len(train))
    if epochs > 0:
        config = fine_tune(argparse.Namespace(**{**vars(args), "finetune_epochs": epochs}),
                            config, [s.prompt for s in train], lengths)
    elif args.encoder:
        copy_encoder_beside(args)
    predictor = Predictor(config)
    created = seed_in_chunks(predictor, args.model, [s.prompt for s in train], lengths)
    log.info("training the MLP on %d records", predictor.store.count(args.model))
    version = predictor.retrain(args.model)
    path = mlp_path(config, args.model)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mlp.save(predictor.mlps.get(args.model).module, path, len(train),
                 predictor.embedder.encoder_id)
    print(f"seeded {len(train)} records ({created} new points, "
          f"{predictor.store.count(args.model)} in DB) for model {args.model!r}; MLP v{version}"
          f"{' saved to ' + path if path else ''} in {time.perf_counter() - t0:.1f}s")
    predictor.store.close()
    return 0


SEED_CHUNK = 1024


def seed_in_chunks(predictor, model: str, prompts: list[str], lengths) -> int:
    """Seed with a progress line per chunk: embedding thousands of prompts takes minutes."""
    created, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), SEED_CHUNK):
        created += predictor.seed(model, prompts[i:i + SEED_CHUNK], lengths[i:i + SEED_CHUNK])
        done = min(len(prompts), i + SEED_CHUNK)
        log.info("embedded %d/%d prompts (%.0f/s)", done, len(prompts),
                 done / max(time.perf_counter() - t0, 1e-9))
    return created


def register_subcommands(sub) -> None:
    s = sub.add_parser("serve", help="run the gRPC PredictorService")
    add_serve_args(s)
    s.set_defaults(func=serve)
    b = sub.add_parser("build", help="seed the DB from a data set and train the MLP")
    add_common(b)
    add_data_args(b)
    add_finetune_args(b, None, "first fine-tune the encoder on the records' lengths (default: "
                               "2 epochs with 2,000 records or more; 0 = stock encoder)")
    b.add_argument("--encoder-out", default=None,
                   help="where the fine-tuned encoder goes (default: beside --qdrant-path)")
    b.set_defaults(func=build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.predictor")
    register_subcommands(parser.add_subparsers(dest="action", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
