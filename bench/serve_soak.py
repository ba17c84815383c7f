#!/usr/bin/env python3
"""Soak `magnetar serve`: many clients, every route and way of ending a request, for minutes; the server's memory,
file descriptors and threads sampled throughout.

    bench/serve_soak.py MODEL.gguf [--minutes M] [--clients C] [--seed S] [--ctx N] [--no-disk-kv] [--out FILE.json]
                        -- SERVE_FLAGS...

One server (MAGNETAR names the binary, default build/tools/magnetar) with `--parallel 4 --ctx N --chat-template chatml
--kv-disk-dir TMP --kv-block 256` (no disk KV with --no-disk-kv) and SERVE_FLAGS. C client threads loop over scenarios
picked at random: OpenAI chat (plain, streamed, a forced tool call, a JSON answer, a multi-turn conversation that
grows until it nearly fills the context), Anthropic messages (plain, streamed, thinking, a forced tool), legacy
completions, streams and non-streamed requests the client hangs up on, malformed bodies, count_tokens,
tokenize/detokenize, metrics, models and health. Every answer is checked (status, shape, SSE event order, tool
arguments and JSON answers that parse, tokenize round trips); a failure is recorded with its scenario. Every 2 s the
server's VmRSS, open descriptors and threads are read from /proc.

At the end: SIGTERM, and the exit status must be 0. Prints a JSON summary (requests per scenario, failures, the
samples' first/last/peak and the least-squares growth of RSS over the second half of the run, per 1,000 requests,
and the server's counters from /metrics just before the SIGTERM: tokens, --lookup drafts, disk KV blocks) and exits 1
when a check failed, the server died or did not stop cleanly, or descriptors or threads grew between the first and
last quarter by more than the clients can hold open.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("the of light strlen python function model expert token stream answer question river mountain code "
         "memory cache disk layer route sample value list string file open close read write").split()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}}, "required": ["path"]}}}]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)


def start_server(binary, model, flags):
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0"] + flags, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "listening on http://" in line:
            port = int(line.split("listening on http://")[1].split(":")[1].split()[0])
            tail = lines[-50:]

            def drain():
                for rest in proc.stderr:
                    tail.append(rest)
                    del tail[:-50]
            threading.Thread(target=drain, daemon=True).start()
            return proc, port, tail
    sys.exit("the server did not start:\n" + "".join(lines))


class Client:
    def __init__(self, port, rng, ctx):
        self.port, self.rng, self.ctx = port, rng, ctx
        self.conversation = []

    def words(self, lo, hi):
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def call(self, method, path, body=None, raw=None):
        conn = self.connect()
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, data, {"Content-Type": "application/json"} if data is not None else {})
        r = conn.getresponse()
        payload = r.read()
        conn.close()
        return r.status, payload

    def ok_json(self, method, path, body):
        status, payload = self.call(method, path, body)
        expect(status == 200, f"{path}: status {status}: {payload[:200]!r}")
        return json.loads(payload)

    def sse(self, path, body, hang_up_after=None):
        """The events of a stream (data: JSON lines; 'event:' names kept for the Anthropic route), or the first
        hang_up_after of them when the client closes the connection then."""
        conn = self.connect()
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise Failure(f"{path} stream: status {r.status}: {r.read()[:200]!r}")
        events, name, done = [], None, False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\r\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                if line == "data: [DONE]":
                    done = True
                    continue
                expect(not done, f"{path}: data after [DONE]")
                events.append((name, json.loads(line[6:])))
                name = None
                if hang_up_after is not None and len(events) >= hang_up_after:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                    conn.close()
                    return events, False
        conn.close()
        return events, done

    def chat_body(self, **extra):
        body = {"messages": [{"role": "user", "content": self.words(3, 30)}],
                "max_tokens": self.rng.randint(1, 48), "temperature": self.rng.choice([0, 0.7, 1.0])}
        body.update(extra)
        return body

    # Scenarios: each returns nothing and raises Failure on a wrong answer.
    def openai_plain(self):
        out = self.ok_json("POST", "/v1/chat/completions", self.chat_body())
        choice = out["choices"][0]
        expect(choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']}")
        expect(isinstance(choice["message"]["content"], str), "content not a string")
        expect(out["usage"]["completion_tokens"] >= 1, "no completion tokens")

    def openai_stream(self):
        events, done = self.sse("/v1/chat/completions", self.chat_body(stream=True,
                                                                    stream_options={"include_usage": True}))
        expect(done, "stream without [DONE]")
        finishes = [e["choices"][0]["finish_reason"] for _, e in events if e.get("choices")
                    and e["choices"][0].get("finish_reason")]
        expect(len(finishes) == 1 and finishes[0] in ("stop", "length"), f"finish reasons {finishes}")
        expect("usage" in events[-1][1] and events[-1][1]["usage"], "no usage chunk last")

    def openai_tool(self):
        choice = self.rng.choice(["required", {"type": "function", "function": {"name": "read_file"}}])
        out = self.ok_json("POST", "/v1/chat/completions",
                           self.chat_body(tools=TOOLS, tool_choice=choice, max_tokens=64, temperature=0.7))
        c = out["choices"][0]
        if c["finish_reason"] == "tool_calls":
            call = c["message"]["tool_calls"][0]["function"]
            expect(call["name"] in ("get_weather", "read_file"), f"tool name {call['name']}")
            expect(isinstance(json.loads(call["arguments"]), dict), "arguments not an object")
        else:
            expect(c["finish_reason"] == "length", f"forced call ended {c['finish_reason']}")

    def openai_json(self):
        out = self.ok_json("POST", "/v1/chat/completions",
                           self.chat_body(response_format={"type": "json_object"}, max_tokens=64))
        c = out["choices"][0]
        expect(isinstance(json.loads(c["message"]["content"]), dict), "JSON answer does not parse")

    def openai_conversation(self):
        self.conversation.append({"role": "user", "content": self.words(5, 60)})
        out = self.ok_json("POST", "/v1/chat/completions",
                           {"messages": self.conversation, "max_tokens": 32, "temperature": 0.8})
        self.conversation.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        # Starts over before the next turn could overflow the context (a message of 60 words is at most ~500 bytes,
        # a token each with a byte-level vocabulary).
        if out["usage"]["total_tokens"] + 600 > self.ctx:
            self.conversation = []

    def anthropic_plain(self):
        body = {"model": "x", "max_tokens": self.rng.randint(1, 48), "system": self.words(2, 10),
                "messages": [{"role": "user", "content": self.words(3, 30)}]}
        if self.rng.random() < 0.3:
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        out = self.ok_json("POST", "/v1/messages", body)
        expect(out["type"] == "message" and out["stop_reason"] in ("end_turn", "max_tokens"),
               f"stop_reason {out.get('stop_reason')}")

    def anthropic_stream(self):
        body = {"model": "x", "max_tokens": self.rng.randint(1, 48), "stream": True,
                "messages": [{"role": "user", "content": self.words(3, 30)}]}
        if self.rng.random() < 0.5:
            body.update(tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}, max_tokens=64)
        events, _ = self.sse("/v1/messages", body)
        names = [n for n, _ in events if n != "ping"]
        expect(names and names[0] == "message_start" and names[-1] == "message_stop", f"events {names[:3]}..")
        open_blocks = 0
        for n in names:
            open_blocks += (n == "content_block_start") - (n == "content_block_stop")
            expect(0 <= open_blocks <= 1, "blocks overlap")
        for n, e in events:
            if n == "content_block_start" and e["content_block"]["type"] == "tool_use":
                expect(e["content_block"]["name"] in ("get_weather", "read_file"), "tool name")

    def legacy(self):
        out = self.ok_json("POST", "/v1/completions", {"prompt": self.words(2, 20), "max_tokens": 16,
                                                       "temperature": 0.5})
        expect(out["object"] == "text_completion", "object")

    def hang_up_stream(self):
        path = self.rng.choice(["/v1/chat/completions", "/v1/messages"])
        body = {"model": "x", "max_tokens": 200, "stream": True, "messages": [{"role": "user",
                                                                              "content": self.words(3, 30)}]}
        self.sse(path, body, hang_up_after=self.rng.randint(1, 5))

    def hang_up_plain(self):
        conn = self.connect()
        conn.request("POST", "/v1/chat/completions", json.dumps(self.chat_body(max_tokens=200)),
                     {"Content-Type": "application/json"})
        time.sleep(self.rng.uniform(0, 0.3))
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()

    def malformed(self):
        path = self.rng.choice(["/v1/chat/completions", "/v1/messages", "/v1/completions"])
        raw = self.rng.choice(['{"messages": [', '{"messages": 3}', '[]', '{"messages": [{"role": "user"}]}',
                               '{"max_tokens": -1, "messages": [{"role":"user","content":"x"}]}', 'null',
                               '{"prompt": {"a": 1}}', '\xff\xfe'])
        status, payload = self.call("POST", path, raw=raw)
        expect(status == 400, f"malformed body {raw!r} on {path}: status {status}")
        expect("error" in json.loads(payload), "error body")

    def small_routes(self):
        text = self.words(1, 40)
        tokens = self.ok_json("POST", "/tokenize", {"content": text})["tokens"]
        back = self.ok_json("POST", "/detokenize", {"tokens": tokens})["content"]
        expect(back == text, f"tokenize round trip {text!r} -> {back!r}")
        n = self.ok_json("POST", "/v1/messages/count_tokens",
                         {"model": "x", "messages": [{"role": "user", "content": text}]})["input_tokens"]
        expect(n >= len(tokens), "count_tokens below the text's tokens")
        for path in ("/metrics", "/v1/models", "/health"):
            status, _ = self.call("GET", path)
            expect(status == 200, f"{path}: status {status}")
        status, _ = self.call("GET", "/no/such/route")
        expect(status == 404, f"unknown route: status {status}")


SCENARIOS = [("openai_plain", 4), ("openai_stream", 4), ("openai_tool", 2), ("openai_json", 2),
             ("openai_conversation", 3), ("anthropic_plain", 2), ("anthropic_stream", 3), ("legacy", 1),
             ("hang_up_stream", 2), ("hang_up_plain", 1), ("malformed", 2), ("small_routes", 1)]


def proc_sample(pid):
    status = open(f"/proc/{pid}/status").read()
    field = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in status.splitlines() if ":" in ln)}
    return {"rss_kib": int(field["VmRSS"].split()[0]), "threads": int(field["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def slope(points):
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def tenths(samples):
    """[[requests, KiB of RSS added], ...] over each tenth of the run's samples."""
    if len(samples) < 11:
        return []
    at = [samples[round(i * (len(samples) - 1) / 10)] for i in range(11)]
    return [[b["requests"] - a["requests"], b["rss_kib"] - a["rss_kib"]] for a, b in zip(at, at[1:])]


def server_counters(port):
    """The unlabelled magnetar_* counters and gauges of /metrics, by name (empty when it does not answer)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    except (OSError, http.client.HTTPException):
        return {}
    counters = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith("magnetar_") and "{" not in parts[0]:
            counters[parts[0]] = float(parts[1])
    return counters


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ctx", type=int, default=2048, help="the server's --ctx (conversations start over before it)")
    p.add_argument("--out")
    p.add_argument("--no-disk-kv", action="store_true", help="serve without --kv-disk-dir (its index grows with the blocks)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    binary = os.environ.get("MAGNETAR", "build/tools/magnetar")
    kv_dir = tempfile.mkdtemp(prefix="magnetar-soak-kv-")
    disk_kv = [] if args.no_disk_kv else ["--kv-disk-dir", kv_dir, "--kv-block", "256"]
    flags = ["--parallel", "4", "--ctx", str(args.ctx), "--chat-template", "chatml"] + disk_kv + argv[cut + 1:]
    proc, port, stderr_tail = start_server(binary, args.model, flags)
    lock = threading.Lock()
    counts, failures, samples = {}, [], []
    done_requests = [0]
    stop_at = time.monotonic() + args.minutes * 60
    names = [n for n, w in SCENARIOS for _ in range(w)]

    def client(i):
        c = Client(port, random.Random(args.seed * 1000 + i), args.ctx)
        while time.monotonic() < stop_at and proc.poll() is None:
            name = c.rng.choice(names)
            try:
                getattr(c, name)()
                error = None
            except (Failure, OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as e:
                error = f"{name}: {type(e).__name__}: {e}"
            with lock:
                counts[name] = counts.get(name, 0) + 1
                done_requests[0] += 1
                if error:
                    failures.append(error)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if proc.poll() is None:
            with lock:
                n = done_requests[0]
            try:
                samples.append(dict(proc_sample(proc.pid), t=round(time.monotonic() - t0, 1), requests=n))
            except (OSError, KeyError):
                pass
        time.sleep(2)
    for t in threads:
        t.join()
    died = proc.poll()
    counters = server_counters(port) if died is None else {}
    if died is None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "did not stop within 60 s"
    else:
        code = f"died during the run with {died}"
    shutil.rmtree(kv_dir, ignore_errors=True)
    half = samples[len(samples) // 2:]
    quarter = max(1, len(samples) // 4)
    first, last = samples[:quarter], samples[-quarter:]
    grew = {k: max(s[k] for s in last) - max(s[k] for s in first) for k in ("fds", "threads")} if samples else {}
    summary = {
        "minutes": args.minutes, "clients": args.clients, "requests": done_requests[0], "per_scenario": counts,
        "failures": len(failures), "first_failures": failures[:10], "exit_status": code,
        "rss_kib": {"first": samples[0]["rss_kib"], "last": samples[-1]["rss_kib"],
                    "peak": max(s["rss_kib"] for s in samples)} if samples else None,
        "rss_kib_per_1000_requests_second_half": round(1000 * slope([(s["requests"], s["rss_kib"]) for s in half]), 1),
        "fds": [samples[0]["fds"], samples[-1]["fds"]] if samples else None,
        "threads": [samples[0]["threads"], samples[-1]["threads"]] if samples else None,
        "growth_first_to_last_quarter": grew,
        # Settling or a leak: what each tenth of the run added to RSS, with its requests (a leak adds about the same
        # per request in every tenth; settling adds less and less).
        "rss_kib_added_per_tenth": tenths(samples),
        # The server's own counts at the end (/metrics): tokens, drafts (--lookup), disk KV blocks.
        "counters": counters,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "samples": samples, "failures": failures}, f, indent=1)
    # Descriptors and threads follow the connections open at the moment (a thread each): growth beyond what the
    # clients can hold open is a leak.
    bad = failures or code != 0 or any(v > 2 * args.clients + 4 for v in grew.values())
    if bad:
        print("server stderr (last lines):\n" + "".join(stderr_tail), file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
