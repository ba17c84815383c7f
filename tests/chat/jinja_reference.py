#!/usr/bin/env python3
"""The reference side of the Jinja parity test: Python jinja2 set up as Hugging Face transformers'
apply_chat_template sets it up (utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and a {% generation %} tag (transformers' assistant
tracker; without tracking it renders its body), the globals raise_exception and strftime_now, and a tojson
filter that is json.dumps with ensure_ascii off. This is the engine that renders the prompts models were
trained on.

usage: python3 jinja_reference.py < batch.json > results.jsonl
  stdin   {"template": "...", "contexts": [{...}, ...]}, or {"cases": [{"template": "...", "context": {...}}]}
          A context is passed as the keyword arguments of render(), as transformers passes messages, tools,
          documents, add_generation_prompt, its extra kwargs and the special tokens.
  stdout  one line per context (per case): {"ok": true, "text": "..."} or {"ok": false, "error": "..."}; a
          template that does not parse gives {"ok": false, "error": "parse: ..."}
Exits 3 when jinja2 cannot be imported (the test then skips and says so).
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    sys.stderr.write("jinja2 is not installed: %s\n" % e)
    sys.exit(3)


class Generation(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers records where it lands)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_body", [], [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def compile_template(env, source):
    try:
        return env.from_string(source), None
    except Exception as e:  # noqa: BLE001 -- any failure is a result to compare
        return None, "parse: %s" % e


def render(template, context):
    try:
        return {"ok": True, "text": template.render(**context)}
    except Exception as e:  # noqa: BLE001 (RecursionError, TypeError, ... all count as a raise)
        return {"ok": False, "error": str(e)}


def main():
    batch = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    env = environment()
    results = []
    if "cases" in batch:
        for case in batch["cases"]:
            template, error = compile_template(env, case["template"])
            results.append(render(template, case["context"]) if template else {"ok": False, "error": error})
    else:
        template, error = compile_template(env, batch["template"])
        for context in batch["contexts"]:
            results.append(render(template, context) if template else {"ok": False, "error": error})
    out = sys.stdout.buffer
    for r in results:
        # ensure_ascii: a lone surrogate from the input survives the trip as an escape
        out.write(json.dumps(r, ensure_ascii=True).encode("ascii") + b"\n")


if __name__ == "__main__":
    main()
