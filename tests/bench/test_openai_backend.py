"""openai:<url> against a tiny streaming server started in the test."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from lenserve.bench.backends import BackendOptions, create_backend, parse_backend_spec
from lenserve.bench.runner import RunnerConfig, replay
from lenserve.workloads.types import BenchRequest, Workload

QUIET = RunnerConfig(show_progress=False)


class CompletionsHandler(BaseHTTPRequestHandler):
    """Streams ``max_tokens`` chunks of one token each, or 400 for a prompt of "bad"; "cut"
    ends the connection after one chunk, "garbage" sends an event that is not JSON. HTTP/1.0
    (the body ends when the connection does) or, as uvicorn answers, HTTP/1.1 chunked."""

    received: ClassVar[list[dict]] = []
    chunked: ClassVar[bool] = False

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append({"path": self.path, **body})
        if body["prompt"] == "bad":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "bad prompt"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(body["max_tokens"]):
            time.sleep(0.005)
            self._event({"choices": [{"index": 0, "text": f"t{i} "}]})
            if body["prompt"] == "cut":
                self.close_connection = True
                return
        if body["prompt"] == "garbage":
            self._write(b"data: {not json\r\n\r\n")
        self._event({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}})
        self._write(b"data: [DONE]\n\n")
        if self.chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _event(self, data: dict) -> None:
        self._write(f"data: {json.dumps(data)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        if self.chunked:        # one HTTP chunk split in two writes, as TCP may deliver it
            self.wfile.write(f"{len(data):x}\r\n".encode() + data[:7])
            self.wfile.flush()
            data = data[7:] + b"\r\n"
        self.wfile.write(data)
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture(params=["http/1.0", "http/1.1 chunked"])
def server(request):
    CompletionsHandler.received = []
    CompletionsHandler.chunked = request.param.endswith("chunked")
    CompletionsHandler.protocol_version = "HTTP/1.1" if CompletionsHandler.chunked else "HTTP/1.0"
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), CompletionsHandler)
    httpd.handle_error = lambda *args: None     # a client that timed out broke the pipe
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def run_against(url: str, requests, timeout_s: float = 600.0) -> list:
    backend = create_backend(parse_backend_spec(f"openai:{url}"),
                             BackendOptions(model="m", served_model_name="served",
                                            request_timeout_s=timeout_s))
    backend.start()
    try:
        return replay(backend, Workload("w", tuple(requests)), QUIET).records
    finally:
        backend.close()


def test_streams_are_timed_per_chunk_and_sent_like_vllm(server):
    requests = [BenchRequest("a", (5, 6, 7), 4, 0.0, prompt="hello"),
                BenchRequest("b", (8, 9), 6, 0.01)]       # no text: token ids are sent
    a, b = run_against(server, requests)
    assert (a.num_output_tokens, b.num_output_tokens) == (4, 6)
    assert len(a.token_times) == 4 and a.token_times == sorted(a.token_times)
    assert a.success and a.arrival_time <= a.token_times[0] <= a.finish_time
    sent = {r["prompt"] if isinstance(r["prompt"], str) else "ids": r for r in CompletionsHandler.received}
    assert sent["hello"]["path"] == "/v1/completions"
    assert sent["hello"]["stream"] is True and sent["hello"]["ignore_eos"] is True
    assert sent["hello"]["max_tokens"] == 4 and sent["hello"]["model"] == "served"
    assert sent["ids"]["prompt"] == [8, 9]


def test_http_errors_and_dead_servers_become_failed_records(server):
    (bad,) = run_against(server, [BenchRequest("x", (1, 2, 3), 2, prompt="bad")])
    assert not bad.success and "HTTP 400" in bad.error
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    (dead,) = run_against(f"http://127.0.0.1:{dead_port}", [BenchRequest("y", (1, 2, 3), 2)])
    assert not dead.success and "Connect" in dead.error


def test_a_cut_or_garbled_stream_is_a_failed_record_not_a_hang(server):
    cut, garbage, fine = run_against(server, [BenchRequest("c", (1,), 3, prompt="cut"),
                                              BenchRequest("g", (1,), 2, prompt="garbage"),
                                              BenchRequest("f", (1,), 2, prompt="fine")])
    assert fine.success and fine.num_output_tokens == 2
    assert not garbage.success and "JSONDecodeError" in garbage.error
    if CompletionsHandler.chunked:      # HTTP/1.0 has no framing: EOF is the end of the body
        assert not cut.success and "closed" in cut.error
    else:
        assert cut.success and len(cut.token_times) == 1


def test_a_stream_past_the_request_timeout_fails(server):
    start = time.monotonic()
    (slow,) = run_against(server, [BenchRequest("s", (1,), 400)], timeout_s=0.3)
    assert not slow.success and "Timeout" in slow.error
    assert time.monotonic() - start < 1.5          # 400 chunks take 2 s
