#!/usr/bin/python3
"""An independent side for the activity payload's interop tests (docs/payload.md §6).

Run by Tests/BatonWireTests/ActivityPayloadTests.swift with Debian's /usr/bin/python3 and
python3-cbor2 (installed by scripts/setup). The expected values below are written a second
time, in Python, on purpose: the Swift tests hold their own copy, and the two must agree.

  cbor_interop.py check NAME HEX    cbor2 decodes HEX; it must equal CASES[NAME] (types too),
                                    and, unless NAME is in LENGTH_FIRST_DIFFERS, be byte-equal
                                    to cbor2's canonical encoding of CASES[NAME]
  cbor_interop.py emit NAME         hex of cbor2.dumps(CASES[NAME], canonical=True)
  cbor_interop.py emit-loose NAME   hex of cbor2's default (non-canonical) encoding of LOOSE[NAME]
  cbor_interop.py json NAME         stdin is Swift's JSON rendering; it must parse (strictly)
                                    and equal this script's own mapping of CASES[NAME]

Exit status: 0 ok, 1 mismatch (the reason on stderr), 3 cbor2 missing.
"""
import base64
import json
import math
import sys
from datetime import datetime, timezone

try:
    import cbor2
    from cbor2 import CBORTag
except ImportError:
    sys.stderr.write("python3-cbor2 is missing for %s: run scripts/setup\n" % sys.executable)
    sys.exit(3)

UTC = timezone.utc
VERSION, TYPE, TITLE, URL, REQUIRED, USERINFO = range(6)

CASES = {
    # The vector in docs/payload.md §5.
    "vector": {
        VERSION: 1,
        TYPE: "com.example.reader.article",
        TITLE: "Chapter 3",
        URL: CBORTag(32, "https://example.com/books/3"),
        REQUIRED: ["position"],
        USERINFO: {"position": 1234, "night": True, "scale": 1.5},
    },
    "minimal": {VERSION: 1, TYPE: "com.example.a"},
    # Every userInfo kind (docs/payload.md §3).
    "kinds": {
        VERSION: 1,
        TYPE: "org.example.kinds",
        USERINFO: {
            "array": [1, "two", 3.5, [None]],
            "data": b"\x00\x01\xfe\xff",
            "empty-data": b"",
            "date": datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
            "date-frac": datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC),
            "date-old": datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC),
            "dict": {"inner": {"deep": None, "n": 0}},
            "null": None,
            "int": 1234567890123,
            "neg": -42,
            "min": -9223372036854775808,
            "max": 9223372036854775807,
            "half": 1.5,
            "single": 100000.0,
            "double": 0.1,
            "negzero": -0.0,
            "inf": math.inf,
            "nan": math.nan,
            "true": True,
            "false": False,
            "set": {"bb", "a", "c"},
            "intset": {1000, 1, 100, 2},
            "string": "Gr\u00fc\u00dfe, \u4e16\u754c \U0001F389 \"q\" \\ \n\t\x01",
            "url": CBORTag(32, "file:///tmp/x?y=1#z"),
        },
    },
    # A set of mixed kinds: RFC 8949 §4.2.1 orders it 1000 (0x19…), -1 (0x20), "a" (0x61…);
    # cbor2 5.4's canonical=True uses RFC 7049's length-first order instead: -1, "a", 1000.
    "mixed-set": {VERSION: 1, TYPE: "com.example.sets", USERINFO: {"s": {1000, -1, "a"}}},
}

# Where cbor2's length-first order (RFC 7049 §3.9) and RFC 8949's bytewise order differ.
LENGTH_FIRST_DIFFERS = {"mixed-set"}

# Encodings a stock encoder produces, each breaking one rule: the first three only because
# canonical=True was left off (cbor2's default), the rest whatever the options.
LOOSE = {
    "unsorted-keys": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"zz": 1, "a": 2}},
    "unsorted-top": {TYPE: "com.example.a", VERSION: 1},
    "float64": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"x": 1.5}},
    "tag0-date": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"d": CBORTag(0, "2023-11-14T00:00:00Z")}},
    "undefined": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"u": cbor2.undefined}},
    "bytes-key": {VERSION: 1, TYPE: "com.example.a", USERINFO: {b"k": 1}},
    "int-range": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"big": 2**63}},
    "bignum": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"big": 2**64}},
    "integral-float-date": {VERSION: 1, TYPE: "com.example.a", USERINFO: {"d": CBORTag(1, 1700000000.0)}},
    "ftp-url": {VERSION: 1, TYPE: "com.example.a", URL: CBORTag(32, "ftp://example.com/f")},
    "version-2": {VERSION: 2, TYPE: "com.example.a"},
    "unknown-key": {VERSION: 1, TYPE: "com.example.a", 9: "x"},
}


def same(a, b, path="$"):
    """Equality that also demands equal types (True is not 1, 1.0 is not 1), NaN == NaN,
    and the sign of zero."""
    sets = (set, frozenset)
    if isinstance(a, sets) and isinstance(b, sets):
        if len(a) != len(b):
            return "%s: set sizes %d != %d" % (path, len(a), len(b))
        for x in a:
            if not any(same(x, y, path) is None for y in b):
                return "%s: set element %r missing" % (path, x)
        return None
    if type(a) is not type(b):
        return "%s: type %s != %s (%r vs %r)" % (path, type(a).__name__, type(b).__name__, a, b)
    if isinstance(a, float):
        if math.isnan(a) and math.isnan(b):
            return None
        if a != b or math.copysign(1, a) != math.copysign(1, b):
            return "%s: %r != %r" % (path, a, b)
        return None
    if isinstance(a, dict):
        if set(a) != set(b):
            return "%s: keys %r != %r" % (path, sorted(map(repr, a)), sorted(map(repr, b)))
        for k in a:
            r = same(a[k], b[k], "%s[%r]" % (path, k))
            if r:
                return r
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return "%s: lengths %d != %d" % (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            r = same(x, y, "%s[%d]" % (path, i))
            if r:
                return r
        return None
    if isinstance(a, CBORTag):
        if a.tag != b.tag:
            return "%s: tag %d != %d" % (path, a.tag, b.tag)
        return same(a.value, b.value, path)
    return None if a == b else "%s: %r != %r" % (path, a, b)


def canonical(value):
    return cbor2.dumps(value, canonical=True, datetime_as_timestamp=True)


def bytewise_sorted(items):
    """RFC 8949 §4.2.1 order: by the bytes of each item's encoding."""
    return sorted(items, key=lambda v: canonical(v))


def to_json(v):
    """docs/payload.md §4, written again independently of the Swift renderer."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, datetime):
        return v.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(v, CBORTag) and v.tag == 32:
        return v.value
    if isinstance(v, (set, frozenset)):
        return [to_json(x) for x in bytewise_sorted(v)]
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    raise TypeError("no JSON mapping for %r" % (v,))


def payload_json(p):
    return {
        "version": p[VERSION],
        "activityType": p[TYPE],
        "title": p.get(TITLE),
        "webpageURL": p[URL].value if URL in p else None,
        "requiredUserInfoKeys": list(p.get(REQUIRED, [])),
        "userInfo": to_json(p.get(USERINFO, {})),
    }


def fail(msg):
    sys.stderr.write(msg + "\n")
    sys.exit(1)


def main(argv):
    if len(argv) < 3:
        fail(__doc__)
    mode, name = argv[1], argv[2]
    if mode == "check":
        data = bytes.fromhex(argv[3])
        decoded = cbor2.loads(data)
        r = same(CASES[name], decoded)
        if r:
            fail("cbor2 decoded a different value: " + r)
        if name not in LENGTH_FIRST_DIFFERS and canonical(CASES[name]) != data:
            fail("bytes differ from cbor2's canonical encoding %s" % canonical(CASES[name]).hex())
        print("ok")
    elif mode == "emit":
        print(canonical(CASES[name]).hex())
    elif mode == "emit-loose":
        loose = name in ("unsorted-keys", "unsorted-top", "float64")
        print((cbor2.dumps(LOOSE[name]) if loose else canonical(LOOSE[name])).hex())
    elif mode == "json":
        text = sys.stdin.read()

        def no_constants(c):
            raise ValueError("non-JSON constant %s" % c)

        try:
            got = json.loads(text, parse_constant=no_constants)
        except ValueError as e:
            fail("not JSON (%s): %r" % (e, text))
        r = same(payload_json(CASES[name]), got)
        if r:
            fail("JSON differs: " + r)
        print("ok")
    else:
        fail(__doc__)


if __name__ == "__main__":
    main(sys.argv)
