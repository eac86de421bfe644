"""Word lists for the synthetic text: common English plus support, software and
documentation vocabulary. Nearly every word is one cl100k token after a space, so a
sentence's length in words is close to its length in tokens."""
from __future__ import annotations

from dataclasses import dataclass

DETERMINERS = ("the", "the", "the", "a", "each", "every", "this", "your", "any", "our")
PREPOSITIONS = ("for", "with", "in", "on", "from", "to", "before", "after", "during", "without",
                "within", "about", "under", "through", "across", "between", "against", "by")
ADVERBS = ("carefully", "quickly", "clearly", "usually", "always", "often", "only", "also",
           "first", "finally", "immediately", "automatically", "manually", "directly", "politely",
           "briefly", "safely", "correctly", "regularly", "rarely", "early", "again", "together")
CONNECTIVES = ("However", "In addition", "For example", "In practice", "As a rule", "Otherwise",
               "In most cases", "If possible", "By default", "At the same time", "After that",
               "For this reason", "In general", "When in doubt")

COMMON_NOUNS = (
    "account", "user", "customer", "request", "order", "team", "project", "message", "report",
    "feature", "setting", "option", "problem", "issue", "update", "version", "device", "file",
    "document", "record", "system", "service", "product", "plan", "policy", "question", "answer",
    "process", "step", "result", "change", "error", "access", "support", "manager", "member",
    "email", "page", "network", "workspace", "period", "day", "week", "month", "year", "time",
    "price", "region", "location", "address", "language", "response", "review", "status", "level",
    "limit", "case", "note", "detail", "section", "guide", "example", "rule", "standard",
    "practice", "test", "value", "list", "number", "name", "group", "role", "task", "goal", "job",
    "link", "form", "field", "copy", "item", "tool", "source", "target", "format", "output",
    "input", "reason", "summary", "decision", "owner", "partner", "office", "meeting", "schedule",
)
COMMON_ADJECTIVES = (
    "new", "current", "previous", "active", "secure", "simple", "clear", "correct", "important",
    "available", "valid", "invalid", "specific", "general", "main", "default", "custom", "shared",
    "private", "public", "large", "small", "common", "recent", "final", "complete", "standard",
    "monthly", "annual", "free", "basic", "premium", "official", "local", "remote", "unused",
    "duplicate", "missing", "empty", "slow", "fast", "stable", "consistent", "efficient", "safe",
    "optional", "required", "full", "short", "long", "single", "multiple", "original", "internal",
    "external", "primary", "secondary", "temporary", "permanent", "known", "helpful", "relevant",
)
COMMON_VERBS = (
    "check", "review", "update", "send", "receive", "create", "delete", "use", "provide",
    "include", "explain", "describe", "confirm", "verify", "follow", "contact", "request",
    "process", "handle", "store", "return", "open", "close", "change", "keep", "add", "remove",
    "replace", "support", "require", "allow", "avoid", "improve", "reduce", "increase", "test",
    "share", "track", "manage", "protect", "apply", "select", "enable", "disable", "export",
    "import", "assign", "approve", "reject", "complete", "start", "stop", "repeat", "record",
)

SUPPORT_NOUNS = (
    "refund", "subscription", "license", "password", "invoice", "payment", "charge", "receipt",
    "trial", "discount", "upgrade", "cancellation", "renewal", "seat", "admin", "browser",
    "notification", "integration", "dashboard", "calendar", "backup", "contract", "agent",
    "escalation", "ticket", "warranty", "shipment", "delivery", "balance", "credit", "login",
    "profile", "permission", "sync", "export", "storage", "quota", "outage", "bill", "card",
)
SUPPORT_ADJECTIVES = (
    "billing", "pending", "failed", "expired", "locked", "verified", "unpaid", "overdue",
    "refundable", "prorated", "trial", "enterprise", "mobile", "desktop", "unusual", "urgent",
)

CODE_NOUNS = (
    "function", "module", "class", "method", "variable", "parameter", "argument", "type",
    "object", "string", "loop", "condition", "branch", "commit", "library", "dependency",
    "interface", "query", "database", "table", "column", "index", "cache", "memory", "thread",
    "endpoint", "token", "session", "key", "config", "log", "exception", "handler", "test",
    "buffer", "pointer", "callback", "array", "map", "queue", "lock", "timeout", "retry",
    "request", "response", "client", "server", "schema", "migration", "release", "build",
    "package", "import", "constant", "iterator", "generator", "decorator", "closure", "stack",
)
CODE_ADJECTIVES = (
    "mutable", "immutable", "async", "blocking", "nested", "global", "static", "dynamic",
    "unused", "redundant", "unsafe", "thread-safe", "idempotent", "recursive", "generic",
    "typed", "readable", "testable", "deprecated", "concurrent", "lazy", "cached", "raw",
)
CODE_VERBS = (
    "refactor", "rename", "extract", "inline", "validate", "parse", "serialize", "escape",
    "sanitize", "log", "cache", "load", "save", "read", "write", "run", "build", "deploy",
    "fix", "raise", "catch", "handle", "close", "release", "allocate", "lock", "retry",
    "document", "test", "mock", "benchmark", "profile", "import", "export", "format", "merge",
)

DOC_NOUNS = (
    "interpreter", "expression", "statement", "operator", "integer", "float", "list", "tuple",
    "dictionary", "set", "slice", "index", "string", "character", "variable", "assignment",
    "loop", "function", "argument", "keyword", "module", "package", "namespace", "scope",
    "attribute", "method", "class", "instance", "exception", "file", "stream", "encoding",
    "comprehension", "iterator", "sequence", "element", "value", "result", "example", "prompt",
    "shell", "script", "comment", "literal", "syntax", "indentation", "block", "program",
)
DOC_ADJECTIVES = (
    "built-in", "nested", "optional", "positional", "default", "empty", "negative", "immutable",
    "mutable", "interactive", "standard", "simple", "compound", "arithmetic", "logical",
    "numeric", "textual", "multiple", "arbitrary", "special", "similar", "equivalent",
)

FIRST_NAMES = ("Alex", "Sam", "Jordan", "Taylor", "Morgan", "Casey", "Jamie", "Robin", "Chris",
               "Pat", "Dana", "Lee", "Kim", "Max", "Ana", "Ben", "Eva", "Leo", "Mia", "Noah")


@dataclass(frozen=True)
class Vocab:
    """The nouns, adjectives and verbs one kind of text draws from."""

    nouns: tuple[str, ...]
    adjectives: tuple[str, ...]
    verbs: tuple[str, ...]


GENERAL = Vocab(COMMON_NOUNS, COMMON_ADJECTIVES, COMMON_VERBS)
SUPPORT = Vocab(COMMON_NOUNS + SUPPORT_NOUNS * 2, COMMON_ADJECTIVES + SUPPORT_ADJECTIVES * 2, COMMON_VERBS)
CODE = Vocab(CODE_NOUNS * 2 + COMMON_NOUNS, CODE_ADJECTIVES * 2 + COMMON_ADJECTIVES,
             CODE_VERBS * 2 + COMMON_VERBS)
DOCS = Vocab(DOC_NOUNS * 2 + COMMON_NOUNS, DOC_ADJECTIVES * 2 + COMMON_ADJECTIVES,
             COMMON_VERBS + CODE_VERBS)
