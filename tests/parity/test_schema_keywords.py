"""JSON Schema keywords with exact grammars in some forms (multipleOf, minProperties /
maxProperties, not, keywords beside const / enum), against `jsonschema` as the oracle: each
schema is compiled and every candidate text is fed token by token with the default model's
tokenizer (bench/maskbench's driver); a text the grammar accepts must validate, and one it
refuses must fail validation (the candidates are written the way the grammar writes JSON:
compact, keys in schema order, whole numbers without a fraction; where a form leaves valid
values out, such as the fractional numbers of `not: {type: integer}`, no such candidate is
listed, nor objects reaching minProperties only through two or more keys beyond the declared
ones, which the grammar leaves out since a repeated key counts once). Forms with no exact grammar must be refused with a message naming the keyword.

A fractional multipleOf (0.01, 0.5, 2.5) is taken exactly, so its oracle is `jsonschema`
reading the schema and every candidate with exact decimals (json parse_float=Decimal): a
validator that divides doubles calls 0.07 no multiple of 0.01 (0.07 / 0.01 is
7.000000000000001 there), which is the float's rounding, not the schema's meaning."""
import json
import os
from decimal import Decimal
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench" / "maskbench"))
import maskbench  # noqa: E402

MODEL = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth")) / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def nums(lo, hi):
    return [str(i) for i in range(lo, hi + 1)]


def objs(*keys_sets):
    return [json.dumps({k: i for i, k in enumerate(ks)}, separators=(",", ":")) for ks in keys_sets]


ANY = ["1", "-2", "1.5", '"s"', '""', "null", "true", "false", "[]", "[1]", "{}", '{"a":1}']

# schema, candidate texts
CASES = [
    ({"type": "integer", "multipleOf": 7}, nums(-30, 30) + [str(7 * 123456789), str(7 * 10**20), str(10**20 + 1)]),
    ({"type": "integer", "multipleOf": 5, "minimum": 0}, nums(-12, 31)),
    ({"type": "integer", "multipleOf": 3, "exclusiveMinimum": 0}, nums(-7, 10)),
    ({"type": "integer", "multipleOf": 3, "maximum": -1}, nums(-10, 5)),
    ({"type": "integer", "multipleOf": 4, "minimum": -10, "maximum": 30}, nums(-20, 40)),
    # other bounds: the digit automaton over the value, its remainder and the bounds' digits
    ({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 100000},
     nums(-15, 130) + ["99995", "99996", "100002", "100009", "700000"]),
    ({"type": "integer", "multipleOf": 7, "minimum": -45, "maximum": 1000}, nums(-60, 60) + ["994", "1001"]),
    ({"type": "integer", "multipleOf": 3, "minimum": 5}, nums(-10, 40) + [str(3 * 10**25), str(3 * 10**25 + 1)]),
    ({"type": "integer", "multipleOf": 4, "maximum": -5}, nums(-40, 10) + [str(-4 * 10**22), str(-4 * 10**22 - 2)]),
    # MaskBench's Github_hard---o41232: a whole step below an exclusive maximum, on a number
    ({"type": "number", "multipleOf": 10, "exclusiveMaximum": 100}, nums(-130, 130) + ["90.0", "100.0", "-1000.0"]),
    # an unknown keyword is an annotation: two different values of it merge
    ({"allOf": [{"type": "integer", "x-note": 1}, {"minimum": 3, "x-note": 2}]}, nums(-2, 6) + ["1.5"]),
    ({"type": "number", "multipleOf": 1.0, "minimum": 0}, nums(-3, 12) + ["2.5", str(10**14 + 1)]),
    ({"type": "number", "multipleOf": 20.0}, nums(-41, 41) + [str(20 * 10**13), "1.5"]),
    ({"multipleOf": 2}, ANY + ["4", "-6"]),
    ({"type": "object", "maxProperties": 2}, ["{}"] + objs("a", "ab", "abc", "abcd")),
    ({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2, "maxProperties": 2},
     objs("", "a", "b", "c", "ab", "ac", "bc", "abc", "ax", "abx", "x")),
    ({"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 2},
     objs("a", "ax", "axy", "x", "xy")),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False, "minProperties": 1,
      "maxProperties": 1}, objs("", "a", "b", "ab", "x")),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 1},
     ["{}", '{"a":1}', '{"a":"s"}', '{"a":1,"b":2}']),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 0, "maxProperties": 0}, objs("", "a", "x")),
    ({"not": {"type": "string"}}, ANY),
    ({"not": {"type": ["object", "array", "number"]}}, ANY),
    ({"type": "string", "not": {"enum": ["red", "green", ""]}},
     ['"red"', '"green"', '""', '"blue"', '"re"', '"redd"', '"gree\\u006e"', '"r\\u0065d"', '"\\n"', '"gr\u00e9"']),
    ({"not": {"const": "x"}}, ANY + ['"x"', '"xx"', '"\\u0078"']),
    ({"not": {"enum": [None, True]}}, ANY),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "not": {"required": ["a", "b"]}}, ["5"] + objs("", "a", "b", "ab", "x")),
    ({"type": "integer", "not": {"minimum": 3}}, nums(-2, 6)),
    ({"type": "number", "not": {"exclusiveMaximum": 2.5}}, nums(0, 4) + ["2.5", "2.4", "2.6"]),
    ({"type": "string", "not": {"maxLength": 2}}, ['""', '"a"', '"ab"', '"abc"', '"abcd"']),
    ({"type": "array", "not": {"minItems": 2}}, ["[]", "[1]", "[1,2]", "[1,2,3]"]),
    ({"not": {"not": {"type": "integer", "minimum": 2}}}, ANY + ["2", "3"]),
    ({"not": {"anyOf": [{"type": "string"}, {"type": "object"}]}}, ANY),
    ({"not": {"type": "integer"}}, [t for t in ANY if t != "1.5"] + ["2", "-7"]),
    ({"not": {"allOf": [{"type": "integer"}, {"minimum": 5}]}, "type": "integer"}, nums(0, 8)),
    ({"type": "object", "properties": {"k": {"type": "string"}}, "not": {"properties": {"k": {"const": "x"}}}},
     ["{}", '{"k":"x"}', '{"k":"y"}', '{"k":1}']),
    ({"allOf": [{"not": {"type": "string"}}, {"not": {"type": "null"}}]}, ANY),
    ({"enum": [1, 2, 3, "a", 4.0], "not": {"type": "string"}, "multipleOf": 2}, ["1", "2", "3", '"a"', "4", "4.0"]),
    ({"enum": [[1, 1], [1, 2]], "uniqueItems": True}, ["[1,1]", "[1,2]"]),
    ({"enum": [{"a": 1}, {"b": 1}], "not": {"required": ["a"]}}, ['{"a":1}', '{"b":1}']),
    ({"enum": ["x", "yy"], "if": {"maxLength": 1}, "then": {"pattern": "^x$"}, "else": {"const": "zz"}},
     ['"x"', '"yy"']),
]

# fractional multipleOf, every candidate judged with exact decimals (DECIMAL_CASES' docstring above)
FRACTIONS = ["0", "0.0", "-0", "1", "-3", "-4", "7", "0.5", "0.25", "0.75", "0.125", "1.5", "-2.5", "2.50", "0.01", "0.07",
             "-0.07", "0.05", "0.1", "0.3", "3.10", "3.100", "3.1001", "19.99", "99.99", "99.991", "100", "0.001",
             "0.005", "12.345", "-12.34", "5", "7.5", "10", "12.5", "15", "0.6", "0.2", "1.0000000000000001"]
DECIMAL_CASES = [
    ({"type": "number", "multipleOf": 0.01}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.1}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 99.99}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.01, "minimum": -100000000.0, "maximum": 100000000.0}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.01, "exclusiveMinimum": 0.005, "exclusiveMaximum": 19.99}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.5}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.25, "minimum": 0}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.05, "maximum": 0}, FRACTIONS),
    ({"type": "number", "multipleOf": 2.5, "minimum": -5, "exclusiveMaximum": 15}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.125}, FRACTIONS),
    ({"type": "number", "multipleOf": 1, "minimum": 0}, FRACTIONS + ["12500.0", "3.00", "-1.0"]),
    ({"type": "number", "multipleOf": 5}, FRACTIONS + ["12500.0", "-5.0", "5.01"]),
    ({"type": "integer", "multipleOf": 2.5}, [t for t in FRACTIONS if "." not in t]),
    ({"enum": [0.07, 0.075, 1, "a", 2.5], "multipleOf": 0.01}, ["0.07", "0.075", "1", '"a"', "2.5", "0.7"]),
    ({"type": "integer", "multipleOf": 0.5, "minimum": -3}, [t for t in FRACTIONS if "." not in t]),
    # other bounds: the digit automaton over the value in units of the step
    ({"type": "number", "multipleOf": 0.5, "minimum": 1}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.5, "minimum": -3.2, "maximum": 12}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -10, "exclusiveMaximum": 19.5}, FRACTIONS),
    ({"type": "number", "multipleOf": 2.5, "maximum": 12}, FRACTIONS),
    ({"type": "number", "multipleOf": 0.125, "minimum": -1.5}, FRACTIONS),
    ({"type": "number", "multipleOf": 1.5, "minimum": 0.1, "maximum": 1e6}, FRACTIONS),
]

REFUSED = [
    ({"not": {"pattern": "a"}}, "keyword 'pattern' inside 'not'"),
    # nothing satisfies it (jsonschema: "abc" is longer than 2): refused, not served as an empty turn
    ({"const": "abc", "maxLength": 2}, "accepts no output at all"),
    ({"type": "number", "multipleOf": 0.25, "minimum": 1e17, "maximum": 1e18}, "multipleOf 0.25 with a bound beyond"),
    ({"type": "number", "multipleOf": 0.3333}, "multipleOf 0.3333"),
    ({"type": "number", "multipleOf": 1 / 3}, "multipleOf 0.333333"),
    ({"not": {"enum": [1]}}, "'not' with enum / const values"),
    ({"type": "string", "not": {"const": "a\"b"}}, "'not' with a string value"),
    ({"type": "object", "minProperties": 3}, "minProperties 3"),
    ({"enum": ["a"], "format": "ipv6"}, "enum value 0"),
    # anyOf under allOf combine pairwise; their product is bounded, not followed for minutes
    ({"allOf": [{"anyOf": [{"minimum": i + 10 * j} for i in range(8)]} for j in range(6)]}, "branch pairs"),
]


def run(cases):
    if not MODEL.exists():
        pytest.fail(f"{MODEL} missing: run tools/get_models.sh")
    with tempfile.TemporaryDirectory() as tmp:
        return maskbench.run_hearth(maskbench.build_driver(), str(MODEL), cases, tmp)


def test_keywords_against_jsonschema():
    cases = []
    for i, (schema, texts) in enumerate(CASES):
        check = jsonschema.Draft202012Validator(schema)
        cases.append({"name": f"case{i}", "schema": json.dumps(schema),
                      "tests": [{"valid": check.is_valid(json.loads(t)), "text": t} for t in texts]})
    wrong = []
    for (schema, _), c, r in zip(CASES, cases, run(cases)):
        assert r["error"] is None, (schema, r["error"])
        assert len(r["tests"]) == len(c["tests"])
        for t, v in zip(c["tests"], r["tests"]):
            if t["valid"] != v["accepted"]:
                wrong.append((json.dumps(schema), t["text"], "valid" if t["valid"] else "invalid"))
    assert not wrong, "\n".join(map(str, wrong))
    # the oracle saw both verdicts on every schema but the ones that admit nothing
    for schema, texts in CASES:
        seen = {jsonschema.Draft202012Validator(schema).is_valid(json.loads(t)) for t in texts}
        assert seen == {True, False} or "const" in schema or "enum" in schema, schema


def test_fractional_multiple_of_exactly():
    """No candidate the exact-decimal oracle calls invalid is accepted, and every valid one
    written in its shortest form is (bounded forms write the multiples' shortest texts only:
    "2.50", "0.0" and "-0" may be refused there, never accepted wrongly); each schema sees both."""
    def shortest(t):
        return t != "-0" and not ("." in t and t.endswith("0"))

    def exact(x):
        return json.loads(json.dumps(x), parse_float=Decimal)
    cases, verdicts = [], []
    for i, (schema, texts) in enumerate(DECIMAL_CASES):
        check = jsonschema.Draft202012Validator(exact(schema))
        v = [check.is_valid(json.loads(t, parse_float=Decimal)) for t in texts]
        assert set(v) == {True, False}, schema
        verdicts.append(v)
        cases.append({"name": f"dec{i}", "schema": json.dumps(schema),
                      "tests": [{"valid": ok, "text": t} for ok, t in zip(v, texts)]})
    wrong = []
    for (schema, texts), v, r in zip(DECIMAL_CASES, verdicts, run(cases)):
        assert r["error"] is None, (schema, r["error"])
        for t, ok, got in zip(texts, v, r["tests"]):
            if (got["accepted"] and not ok) or (ok and shortest(t) and not got["accepted"]):
                wrong.append((json.dumps(schema), t, "valid" if ok else "invalid"))
    assert not wrong, "\n".join(map(str, wrong))


def test_refused_forms_name_the_keyword():
    cases = [{"name": f"r{i}", "schema": json.dumps(s), "tests": []} for i, (s, _) in enumerate(REFUSED)]
    for (schema, needle), r in zip(REFUSED, run(cases)):
        assert r["error"] and needle in r["error"], (schema, r["error"])
