#!/usr/bin/env python3
"""Real coding agents against `magnetar serve`: Claude Code (Anthropic Messages), Codex (OpenAI Responses) and OpenCode
(OpenAI chat completions), each in its non-interactive mode, on the bundled demo model. Not part of `make test`: the
npm packages are ~1 GB (installed once, pinned, into ~/.cache/magnetar/agents; OpenCode also fetches its provider
package on first use). What is checked:
  - Claude Code `-p` answers without an error (its JSON result; 2.1.332 sends a system message after the user's,
    which servers that take only user and assistant messages refuse), and a second identical run reuses the prompt
    the first computed (cache_read_input_tokens >= 90% of the prompt);
  - Codex `exec` ends with exit status 0 and reports the tokens it used (it speaks only /v1/responses), and a second
    identical run reuses the prompt (the server's cached-token counter);
  - OpenCode `run` ends with exit status 0 and prints an answer.
The demo model was trained on 512-token contexts and the agents' prompts are ~5K tokens, so the answers are noise;
what is checked is that the agents accept the server's requests and answers.

usage: python3 bench/agents_check.py [--magnetar build/tools/magnetar] [--model models/magnetar-demo-q8_0.gguf]
exit status 0 when every check passes; one line per check."""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CLAUDE = "@anthropic-ai/claude-code@2.1.332"
CODEX = "@openai/codex@0.171.0"
OPENCODE = "opencode-ai@1.18.33"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install(cache):
    claude = os.path.join(cache, "node_modules/@anthropic-ai/claude-code-linux-x64/claude")
    codex = os.path.join(cache, "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex")
    opencode = os.path.join(cache, "node_modules/opencode-linux-x64/bin/opencode")
    if not all(os.path.exists(b) for b in (claude, codex, opencode)):
        os.makedirs(cache, exist_ok=True)
        print(f"installing {CLAUDE}, {CODEX} and {OPENCODE} into {cache} (~1 GB, once)", file=sys.stderr)
        subprocess.run(["npm", "install", "--prefix", cache, "--no-audit", "--no-fund", CLAUDE, CODEX, OPENCODE],
                       check=True, stdout=subprocess.DEVNULL)
    return claude, codex, opencode


def wait_listening(port, proc, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def metrics(port):
    """The server's (prompt tokens, cached tokens) counters from /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    values = dict(line.split()[:2] for line in body.splitlines() if line and not line.startswith("#"))
    return int(float(values["magnetar_prompt_tokens_total"])), int(float(values["magnetar_cached_tokens_total"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--magnetar", default="build/tools/magnetar")
    ap.add_argument("--model", default="models/magnetar-demo-q8_0.gguf")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/magnetar/agents"))
    args = ap.parse_args()
    claude, codex, opencode = install(args.cache)
    port = free_port()
    work = tempfile.mkdtemp(prefix="magnetar-agents-")
    log = open(os.path.join(work, "serve.log"), "w")
    server = subprocess.Popen([args.magnetar, "serve", "-m", args.model, "--port", str(port), "--ctx", "16384",
                               "--verbose"], stdout=log, stderr=subprocess.STDOUT)
    failures = 0

    def check(name, ok, detail):
        nonlocal failures
        failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    try:
        if not wait_listening(port, server):
            print(f"FAIL the server did not start (log: {log.name})")
            return 1
        env = dict(os.environ, HOME=os.path.join(work, "home"), ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
                   ANTHROPIC_AUTH_TOKEN="unused", ANTHROPIC_MODEL="magnetar-demo-q8_0", DISABLE_TELEMETRY="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CODE_MAX_CONTEXT_TOKENS="16384",
                   CLAUDE_CODE_MAX_OUTPUT_TOKENS="4096")  # the server's --ctx, as the README says
        usage = []
        for run in (1, 2):
            p = subprocess.run([claude, "-p", "Who are you?", "--max-turns", "1", "--output-format", "json"], env=env,
                               cwd=work, capture_output=True, text=True, timeout=600)
            lines = p.stdout.strip().splitlines()
            result = json.loads(lines[-1]) if lines else {}
            u = result.get("usage", {})
            usage.append(u)
            check(f"claude -p (run {run})", p.returncode == 0 and result.get("is_error") is False,
                  f"exit {p.returncode}, is_error {result.get('is_error')}, input {u.get('input_tokens')}, cache read "
                  f"{u.get('cache_read_input_tokens')}, {result.get('ttft_ms')} ms to the first token"
                  + ("" if p.returncode == 0 else f"; {p.stderr.strip()[-300:]}{p.stdout.strip()[-300:]}"))
        prompt = usage[1].get("input_tokens", 0) + usage[1].get("cache_read_input_tokens", 0)
        check("claude's second run reuses the prompt", prompt > 0 and usage[1].get("cache_read_input_tokens", 0)
              >= 0.9 * prompt, f"{usage[1].get('cache_read_input_tokens')} of {prompt} tokens cached")
        codex_home = os.path.join(work, "codex")
        os.makedirs(codex_home)
        with open(os.path.join(codex_home, "config.toml"), "w") as f:
            f.write(f'model = "magnetar-demo-q8_0"\nmodel_provider = "magnetar"\nmodel_context_window = 16384\n'
                    f'[model_providers.magnetar]\nname = "magnetar"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                    f'env_key = "MAGNETAR_API_KEY"\nwire_api = "responses"\nstream_idle_timeout_ms = 600000\n')
        counts = []  # the server's prompt and cached token counters after each run
        for run in (1, 2):
            p = subprocess.run([codex, "exec", "--skip-git-repo-check", "Who are you?"], cwd=work,
                               capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, CODEX_HOME=codex_home, MAGNETAR_API_KEY="x"))
            out = p.stdout + p.stderr
            used = out.split("tokens used")[-1].split()[0] if "tokens used" in out else None
            check(f"codex exec (run {run})", p.returncode == 0 and used is not None,
                  f"exit {p.returncode}, tokens used {used}" + ("" if p.returncode == 0 else f"; {out.strip()[-400:]}"))
            counts.append(metrics(port))
        prompt = counts[1][0] - counts[0][0]
        cached = counts[1][1] - counts[0][1]
        check("codex's second run reuses the prompt", prompt > 0 and cached >= 0.9 * prompt,
              f"{cached} of {prompt} tokens cached")
        with open(os.path.join(work, "opencode.json"), "w") as f:
            json.dump({"provider": {"magnetar": {
                "npm": "@ai-sdk/openai-compatible", "name": "magnetar",
                "options": {"baseURL": f"http://127.0.0.1:{port}/v1"},
                "models": {"magnetar-demo-q8_0": {"name": "demo", "limit": {"context": 16384, "output": 1024}}}}}}, f)
        p = subprocess.run([opencode, "run", "-m", "magnetar/magnetar-demo-q8_0", "Who are you?"], cwd=work,
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, HOME=env["HOME"], PWD=work))  # its project folder is $PWD
        answer = p.stdout.strip()
        check("opencode run", p.returncode == 0 and len(answer) > 0,
              f"exit {p.returncode}, {len(answer)} bytes of answer" + ("" if p.returncode == 0 else
                                                                       f"; {(p.stdout + p.stderr).strip()[-400:]}"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"{'all passed' if failures == 0 else f'{failures} failed'} (server log: {log.name})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
