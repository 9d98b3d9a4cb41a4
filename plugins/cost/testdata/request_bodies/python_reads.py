"""Writes vectors.json: request bodies the cost filter must read exactly as lenient JSON readers
do, or refuse (plugins/cost/src/request.rs's tests read it), each with what Python 3.11's
json.loads(bytes) reads in it ("python": model, stream, include_usage, or null where it raises).
go_reads.go writes Go's reading of each to go_reads.json. Run from this directory:
    python3 python_reads.py && go run go_reads.go
"expect" is the filter's rule (README, "Request bodies the filter cannot read"): "ok" or the
reason it refuses the body (src/unreadable.rs's labels)."""
import base64
import codecs
import json

DOC = {"model": "gpt-unpriced", "messages": [{"role": "user", "content": "hi"}]}
TEXT = json.dumps(DOC)


def nest(depth: int) -> bytes:
    return ('{"model":"gpt-4o-mini","x":' + "[" * (depth - 1) + "]" * (depth - 1) + "}").encode()


VECTORS = [
    # Read alike by every reader that accepts them.
    ("plain", TEXT.encode(), "ok"),
    ("stream_flags", b'{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}', "ok"),
    ("nulls", b'{"model":"m","stream":null,"stream_options":null}', "ok"),
    ("options_without_usage", b'{"model":"m","stream":true,"stream_options":{"include_usage":null}}', "ok"),
    ("escaped_name", b'{"mod\\u0065l":"gpt-4o-mini"}', "ok"),
    ("escaped_value", b'{"model":"gpt-4o-m\\u0069ni","stre\\u0061m":false}', "ok"),
    ("lone_surrogate_in_a_value_not_read", b'{"model":"m","messages":[{"content":"\\ud800"}]}', "ok"),
    ("spellings_inside_values_not_read", b'{"model":"m","messages":[{"Model":"x","model":"y","model":"z"}]}', "ok"),
    ("duplicate_name_not_read", b'{"model":"m","n":1,"n":2}', "ok"),
    ("non_ascii_text", '{"model":"m","messages":[{"content":"h\u00e9 \u017f \u212a \ufb06"}]}'.encode(), "ok"),
    ("whitespace", b' \r\n\t{"model" : "m"}\n ', "ok"),
    ("no_model", b'{"messages":[]}', "ok"),
    ("big_numbers", b'{"model":"m","temperature":1e400,"n":123456789012345678901234567890}', "ok"),
    # Nesting inside members the filter skips: serde_json skips it without a depth limit
    # (Deserializer::ignore_value); Python refuses the deepest (its recursion limit), Go reads it (its limit: depth 10000).
    ("nesting_128", nest(128), "ok"),
    ("nesting_129", nest(129), "ok"),
    ("nesting_1500", nest(1500), "ok"),
    # Not one JSON object in UTF-8.
    ("invalid_utf8_in_a_value", b'{"model":"gpt-unpriced","messages":[{"content":"hi\xff"}]}', "json"),
    ("invalid_utf8_in_a_name", b'{"model":"gpt-unpriced","x\xc3":1}', "json"),
    ("utf8_encoded_surrogate", b'{"model":"gpt-unpriced","x":"\xed\xa0\x80"}', "json"),
    ("overlong_utf8", b'{"model":"gpt-unpriced","x":"\xc0\xaf"}', "json"),
    ("utf8_bom", codecs.BOM_UTF8 + TEXT.encode(), "json"),
    ("utf16_le", TEXT.encode("utf-16-le"), "json"),
    ("utf16_be", TEXT.encode("utf-16-be"), "json"),
    ("utf16_bom", TEXT.encode("utf-16"), "json"),
    ("utf32_le", TEXT.encode("utf-32-le"), "json"),
    ("utf32_be", TEXT.encode("utf-32-be"), "json"),
    ("utf32_bom", TEXT.encode("utf-32"), "json"),
    ("lone_surrogate_in_a_name", b'{"\\ud800":1,"model":"gpt-unpriced"}', "json"),
    ("lone_surrogate_in_the_model", b'{"model":"gpt-4o-mini\\udc00"}', "json"),
    ("nan", b'{"model":"gpt-unpriced","temperature":NaN}', "json"),
    ("infinity", b'{"model":"gpt-unpriced","temperature":-Infinity}', "json"),
    ("second_object_after", b'{"model":"gpt-unpriced"}{"model":"gpt-4o-mini"}', "json"),
    ("data_after", b'{"model":"gpt-unpriced"} x', "json"),
    ("array", b'[{"model":"gpt-unpriced"}]', "json"),
    ("string", b'"{\\"model\\":\\"gpt-unpriced\\"}"', "json"),
    ("number", b"1", "json"),
    ("null", b"null", "json"),
    ("whitespace_only", b" \n", "json"),
    ("control_character", b'{"model":"gpt-unpriced","x":"\x01"}', "json"),
    ("trailing_comma", b'{"model":"gpt-unpriced",}', "json"),
    ("single_quotes", b"{'model':'gpt-unpriced'}", "json"),
    ("comment", b'{"model":"gpt-unpriced"/* x */}', "json"),
    ("nbsp_as_whitespace", '{"model":\u00a0"gpt-unpriced"}'.encode(), "json"),
    # A member the filter reads, twice or spelt otherwise.
    ("model_twice", b'{"model":"gpt-4o-mini","model":"gpt-unpriced"}', "ambiguous_name"),
    ("model_twice_escaped", b'{"model":"gpt-4o-mini","mod\\u0065l":"gpt-unpriced"}', "ambiguous_name"),
    ("stream_twice", b'{"model":"m","stream":true,"stream":false}', "ambiguous_name"),
    ("stream_options_twice", b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"stream_options":{}}', "ambiguous_name"),
    ("include_usage_twice", b'{"model":"m","stream":true,"stream_options":{"include_usage":false,"include_usage":true}}', "ambiguous_name"),
    ("model_capitalised", b'{"Model":"gpt-unpriced"}', "ambiguous_name"),
    ("model_upper_case", b'{"MODEL":"gpt-unpriced"}', "ambiguous_name"),
    ("model_and_upper_case", b'{"model":"gpt-4o-mini","MODEL":"gpt-unpriced"}', "ambiguous_name"),
    ("model_escaped_upper_case", b'{"MOD\\u0045L":"gpt-unpriced"}', "ambiguous_name"),
    ("model_nul", b'{"model":"gpt-4o-mini","model\\u0000":"gpt-unpriced"}', "ambiguous_name"),
    ("stream_long_s", '{"model":"gpt-4o-mini","\u017ftream":true}'.encode(), "ambiguous_name"),
    ("stream_st_ligature", '{"model":"gpt-4o-mini","\ufb06ream":true}'.encode(), "ambiguous_name"),
    ("stream_options_upper", b'{"model":"m","stream":true,"STREAM_OPTIONS":{"include_usage":false}}', "ambiguous_name"),
    ("include_usage_capitalised", b'{"model":"m","stream":true,"stream_options":{"Include_Usage":false}}', "ambiguous_name"),
    ("include_usage_dotless_i", '{"model":"m","stream":true,"stream_options":{"\u0131nclude_usage":false}}'.encode(), "ambiguous_name"),
    ("include_usage_long_s", '{"model":"m","stream":true,"stream_options":{"include_u\u017fage":false}}'.encode(), "ambiguous_name"),
    # A member the filter reads with a type the API does not define.
    ("model_number", b'{"model":7}', "member_type"),
    ("model_null", b'{"model":null}', "member_type"),
    ("model_array", b'{"model":["gpt-unpriced"]}', "member_type"),
    ("model_object", b'{"model":{"name":"gpt-unpriced"}}', "member_type"),
    ("stream_number", b'{"model":"m","stream":1}', "member_type"),
    ("stream_string", b'{"model":"m","stream":"true"}', "member_type"),
    ("stream_options_string", b'{"model":"m","stream":true,"stream_options":"x"}', "member_type"),
    ("stream_options_array", b'{"model":"m","stream":true,"stream_options":[]}', "member_type"),
    ("include_usage_number", b'{"model":"m","stream":true,"stream_options":{"include_usage":0}}', "member_type"),
    ("include_usage_string", b'{"model":"m","stream":true,"stream_options":{"include_usage":"false"}}', "member_type"),
]


def recordable(value):
    """A string with lone surrogates (which json.loads gives and JSON text cannot carry as
    UTF-8) is recorded with U+FFFD in their place."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def python_reads(body: bytes):
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return {"object": False}
    options = doc.get("stream_options")
    return {"object": True, "model": recordable(doc.get("model")), "stream": doc.get("stream"),
            "include_usage": options.get("include_usage") if isinstance(options, dict) else None}


names = [n for n, _, _ in VECTORS]
assert len(names) == len(set(names)), "duplicate vector names"
out = [{"name": n, "expect": e, "body": base64.b64encode(b).decode(), "python": python_reads(b)} for n, b, e in VECTORS]
with open("vectors.json", "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
