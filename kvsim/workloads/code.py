"""Small, plausible code snippets (Python, JavaScript, Go) for code-review requests.

Snippets are assembled from statement templates over identifier words; some carry the
kind of flaw a reviewer would point out (bare except, ``== None``, SQL built with an
f-string, a mutable default argument), so the requests read like real review asks.
"""
from __future__ import annotations

from kvsim.workloads.rng import Rng
from kvsim.workloads.text import approx_tokens

LANGUAGES = ("python", "javascript", "go")
LANGUAGE_WEIGHTS = (0.5, 0.3, 0.2)
LANGUAGE_NAMES = {"python": "Python", "javascript": "JavaScript", "go": "Go"}

_VERBS = ("load", "parse", "fetch", "compute", "validate", "build", "update", "send", "merge",
          "filter", "sort", "format", "normalize", "resolve", "render", "sync", "process",
          "collect", "count", "find", "save", "apply", "check", "encode", "decode")
_NOUNS = ("user", "order", "config", "item", "record", "token", "session", "payment", "invoice",
          "report", "event", "message", "file", "row", "batch", "request", "result", "price",
          "entry", "node", "key", "account", "profile", "product", "job", "task", "header")
_ATTRS = ("id", "name", "status", "price", "quantity", "created_at", "enabled", "email", "total",
          "count", "value", "size", "owner", "tags")
_EXCEPTIONS = ("ValueError", "KeyError", "TimeoutError", "OSError", "ConnectionError")
_TABLES = ("users", "orders", "payments", "sessions", "events", "invoices")


def _camel(*parts: str) -> str:
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def _pascal(*parts: str) -> str:
    return "".join(p.capitalize() for p in parts)


class _Names:
    """Identifiers for one snippet: a function name, arguments, fresh local names."""

    def __init__(self, rng: Rng) -> None:
        self.rng = rng
        self.verb = rng.choice(_VERBS)
        self.noun = rng.choice(_NOUNS)
        self.args = rng.sample(_NOUNS, rng.between(1, 3))
        self.locals: list[str] = list(self.args)

    def var(self) -> str:
        return self.rng.choice(self.locals)

    def fresh(self) -> str:
        name = self.rng.choice(_NOUNS + ("result", "data", "rows", "payload", "items", "total"))
        if name not in self.locals:
            self.locals.append(name)
        return name

    def call(self) -> tuple[str, str]:
        return self.rng.choice(_VERBS), self.rng.choice(_NOUNS)


def _python_block(rng: Rng, n: _Names) -> list[str]:
    v, (cv, cn) = n.var(), n.call()
    kind = rng.below(11)
    if kind == 0:
        return [f"{n.fresh()} = {cv}_{cn}({v})"]
    if kind == 1:
        return [f"if {v} is None:", f"    return {rng.choice(('None', '[]', '0', '{}', 'False'))}"]
    if kind == 2:
        return [f"if {v} == None:", "    return None"]
    if kind == 3:
        item, attr = rng.choice(_NOUNS), rng.choice(_ATTRS)
        out = n.fresh() + "s"
        return [f"{out} = []", f"for {item} in {v}:", f"    if {item}.{attr}:",
                f"        {out}.append({cv}_{cn}({item}))"]
    if kind == 4:
        return ["try:", f"    {n.fresh()} = {cv}_{cn}({v})", "except:", "    pass"]
    if kind == 5:
        exc = rng.choice(_EXCEPTIONS)
        return ["try:", f"    {n.fresh()} = {cv}_{cn}({v}, timeout={rng.choice((5, 10, 30))})",
                f"except {exc} as exc:", f'    logger.warning("{cv} {cn} failed: %s", exc)', "    raise"]
    if kind == 6:
        return [f"with open({v}) as fh:", f"    {n.fresh()} = json.load(fh)"]
    if kind == 7:
        item, attr = rng.choice(_NOUNS), rng.choice(("price", "total", "size", "count"))
        return ["total = 0", f"for {item} in {v}:", f"    total += {item}.{attr} * {item}.quantity"]
    if kind == 8:
        table = rng.choice(_TABLES)
        return [f'query = f"SELECT * FROM {table} WHERE {rng.choice(_ATTRS)} = {{{v}}}"',
                "cursor.execute(query)", f"{n.fresh()} = cursor.fetchall()"]
    if kind == 9:
        return [f"for attempt in range({rng.choice((3, 5))}):", "    try:",
                f"        return {cv}_{cn}({v})", "    except ConnectionError:",
                "        time.sleep(2 ** attempt)"]
    return [f'{v}["{rng.choice(_ATTRS)}"] = {n.var()}']


def python_snippet(rng: Rng, tokens: int) -> str:
    n = _Names(rng)
    args = list(n.args)
    if rng.chance(0.2):
        args.append(f"{rng.choice(_NOUNS)}s=[]")
    elif rng.chance(0.3):
        args.append(f"timeout={rng.choice(('None', '30', '5.0'))}")
    lines = [f"def {n.verb}_{n.noun}({', '.join(args)}):"]
    if rng.chance(0.4):
        lines.append(f'    """{n.verb.capitalize()} the {n.noun} from {" and ".join(n.args)}."""')
    while approx_tokens("\n".join(lines)) < tokens - 8:
        lines += ["    " + line for line in _python_block(rng, n)]
    lines.append(f"    return {n.var()}")
    return "\n".join(lines)


def _js_block(rng: Rng, n: _Names) -> list[str]:
    v, (cv, cn) = n.var(), n.call()
    kind = rng.below(7)
    if kind == 0:
        return [f"const {n.fresh()} = {_camel(cv, cn)}({v});"]
    if kind == 1:
        return [f"if (!{v}) {{", "  return null;", "}"]
    if kind == 2:
        return [f"if ({v} == null) {{", f"  throw new Error('missing {v}');", "}"]
    if kind == 3:
        item, attr = rng.choice(_NOUNS), _camel(*rng.choice(_ATTRS).split("_"))
        return [f"for (const {item} of {v}) {{", f"  if ({item}.{attr}) {{",
                f"    await {_camel(cv, cn)}({item});", "  }", "}"]
    if kind == 4:
        return ["try {", f"  const {n.fresh()} = await fetch(`/api/{cn}s/${{{v}.id}}`);",
                "} catch (err) {", "  console.log(err);", "}"]
    if kind == 5:
        return [f"{v}.forEach(function ({rng.choice(_NOUNS)}) {{",
                f"  total = total + {rng.choice(_NOUNS)}.{rng.choice(('price', 'size', 'count'))};",
                "});"]
    return [f"var {n.fresh()} = JSON.parse(JSON.stringify({v}));"]


def javascript_snippet(rng: Rng, tokens: int) -> str:
    n = _Names(rng)
    head = "async function" if rng.chance(0.6) else "function"
    lines = [f"{head} {_camel(n.verb, n.noun)}({', '.join(n.args)}) {{"]
    while approx_tokens("\n".join(lines)) < tokens - 6:
        lines += ["  " + line for line in _js_block(rng, n)]
    lines += [f"  return {n.var()};", "}"]
    return "\n".join(lines)


def _go_block(rng: Rng, n: _Names) -> list[str]:
    v, (cv, cn) = n.var(), n.call()
    kind = rng.below(6)
    if kind == 0:
        return [f"{n.fresh()}, err := {_camel(cv, cn)}(ctx, {v})", "if err != nil {",
                f'\treturn nil, fmt.Errorf("{cv} {cn}: %w", err)', "}"]
    if kind == 1:
        return [f"{n.fresh()}, _ := {_camel(cv, cn)}({v})"]
    if kind == 2:
        item = rng.choice(_NOUNS)
        return [f"for _, {item} := range {v} {{", f"\tif {item}.{_pascal(*rng.choice(_ATTRS).split('_'))} == \"\" {{",
                "\t\tcontinue", "\t}", f"\tgo {_camel(cv, cn)}({item})", "}"]
    if kind == 3:
        return ["mu.Lock()", f"cache[{v}.ID] = {v}", "mu.Unlock()"]
    if kind == 4:
        return [f"defer {v}.Close()"]
    return [f"if len({v}) == 0 {{", "\treturn nil, nil", "}"]


def go_snippet(rng: Rng, tokens: int) -> str:
    n = _Names(rng)
    params = ", ".join(f"{a} *{_pascal(a)}" for a in n.args)
    lines = [f"func {_pascal(n.verb, n.noun)}(ctx context.Context, {params}) (*{_pascal(n.noun)}, error) {{"]
    while approx_tokens("\n".join(lines)) < tokens - 6:
        lines += ["\t" + line for line in _go_block(rng, n)]
    lines += [f"\treturn {n.var()}, nil", "}"]
    return "\n".join(lines)


def snippet(rng: Rng, language: str, tokens: int) -> str:
    """A function of about ``tokens`` tokens in ``language``."""
    make = {"python": python_snippet, "javascript": javascript_snippet, "go": go_snippet}[language]
    return make(rng, tokens)
