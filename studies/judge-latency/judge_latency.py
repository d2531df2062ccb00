"""What an LLM judge (task.rewards[].judge) costs a step: one scoring call of --rows completions
against a local stub chat-completions server that answers each request after --latency seconds,
with --concurrency requests in flight, against scoring them one after another (rows x latency:
128 x 0.2 s = 25.6 s) and against the bound concurrency allows (ceil(rows / concurrency) x latency).

The stub runs in a child process (a threading HTTP server, so it answers every request it gets
concurrently and only the judge's bound limits what is in flight); the judge is the one
`gspo train` builds (gspo_cli.rewards.judge.make_judge), called as the trainer calls it.

    python studies/judge-latency/judge_latency.py                    # 128 rows, 200 ms, concurrency 16, 5 repeats
    python studies/judge-latency/judge_latency.py --concurrency 1 --repeats 1

Prints markdown; writes nothing. The figures in README.md beside it came from it.
"""

from __future__ import annotations

import argparse
import math
import socket
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

# The stub: every POST answered "Score: 7" after the latency; the most requests in flight at
# once are printed when stdin closes.
STUB = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
latency, port = float(sys.argv[1]), int(sys.argv[2])
lock, state = threading.Lock(), {"now": 0, "max": 0}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with lock:
            state["now"] += 1; state["max"] = max(state["max"], state["now"])
        time.sleep(latency)
        with lock:
            state["now"] -= 1
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Score: 7"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.request_queue_size = 1024  # the default 5 drops SYNs: connects retried after 1 s
server = ThreadingHTTPServer(("127.0.0.1", port), H)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
print(state["max"], flush=True)
"""


def measure(rows: int, latency: float, concurrency: int, repeats: int) -> dict:
    """Wall seconds of each scoring call of `rows` completions, the values it returned, and the
    stub's most requests in flight."""
    from gspo_cli.rewards.judge import make_judge
    from gspo_cli.spec.task import JudgeConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stub = subprocess.Popen(
        [sys.executable, "-c", STUB, str(latency), str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert stub.stdout.readline().strip() == "ready"
        cfg = JudgeConfig(
            url=f"http://127.0.0.1:{port}/v1", model="stub", template="{prompt}\n{completion}", concurrency=concurrency
        )
        judge = make_judge(cfg, "judge", "task.rewards[0].judge", ())
        prompts = [f"prompt {i}" for i in range(rows)]
        completions = [f"completion {i}" for i in range(rows)]
        walls, values = [], None
        for k in range(repeats):
            t = time.perf_counter()
            values = judge(prompts=prompts, completions=completions, trainer_state=SimpleNamespace(global_step=k))
            walls.append(time.perf_counter() - t)
    finally:
        out, _ = stub.communicate("", timeout=30)
    return {"walls": walls, "values": values, "max_in_flight": int(out.split()[-1])}


def render(rows: int, latency: float, concurrency: int, got: dict) -> str:
    serial = rows * latency
    bound = math.ceil(rows / concurrency) * latency
    med = statistics.median(got["walls"])
    lines = [
        f"LLM judge: {rows} rows, stub latency {latency * 1000:.0f} ms per request, concurrency {concurrency} "
        f"(most in flight at the stub: {got['max_in_flight']}; every value {set(got['values'])})",
        "",
        "| | seconds |",
        "|---|---:|",
        f"| serial ({rows} x {latency:g} s) | {serial:.2f} |",
        f"| bound (ceil({rows} / {concurrency}) x {latency:g} s) | {bound:.2f} |",
        f"| one scoring call, median of {len(got['walls'])} | {med:.3f} |",
        f"| each call | {', '.join(f'{w:.3f}' for w in got['walls'])} |",
        "",
        f"{med / serial:.1%} of the serial time; {med - bound:.3f} s over the bound."
        if serial
        else f"{med / rows * 1000:.2f} ms per row without latency.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    print(render(a.rows, a.latency, a.concurrency, measure(a.rows, a.latency, a.concurrency, a.repeats)))


if __name__ == "__main__":
    main()
