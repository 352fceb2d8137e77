"""pagedkv.grammar without a model: the byte automaton's language (JSON, schemas, bounds, whitespace), the
SchemaError of each keyword it cannot honour, and the token masks over a tiny hand-made vocabulary (a token
ending mid-character, stop tokens only once the value is complete, and only they once nothing may follow)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pagedkv.grammar import Grammar, SchemaError, compile_response_format
from pagedkv.grammar.automaton import Automaton
from pagedkv.grammar.masks import TokenMasks
from pagedkv.grammar.matcher import GrammarMatcher
from pagedkv.grammar.vocabulary import TokenVocabulary
from pagedkv.sampling import Sampler, SamplingParams


def accepts(grammar: Grammar, *texts: str) -> list[bool]:
    automaton = Automaton(grammar.term)
    return [automaton.matches(t) for t in texts]


def test_json_object_mode_accepts_objects_with_bounded_whitespace():
    g = Grammar.json_object()
    good = ['{}', '{ }', '{"a": 1}', '{"a":1,"b":[true, null, -2.5, "x\\n\\u00e9\u00e9"]}', '{"a": {"b": {}}}',
            '{"k": "\U0001F600"}']
    bad = ['[1]', '"x"', '{"a" : 1}', '{"a":  1}', '{\n"a": 1}', '{"a": 01}', '{"a": 1.}', '{"a": -0}',
           '{"a": 1,}', '{"a": "\x01"}', '{"a": "\\x"}', '{"a": 1} ', '{"a": 1e5}']
    assert accepts(g, *good) == [True] * len(good)
    assert accepts(g, *bad) == [False] * len(bad)


def test_json_object_mode_nests_at_most_six_deep():
    g = Grammar.json_object()
    assert accepts(g, '{"a": [[[[[1]]]]]}', '{"a": [[[[[[1]]]]]]}') == [True, False]


PERSON = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Person", "description": "ignored",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "annotations are ignored", "examples": ["Ada"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120, "default": 30},
        "nick": {"type": "string", "maxLength": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


def test_object_properties_in_schema_order_optional_ones_skippable():
    g = Grammar.json_schema(PERSON)
    assert accepts(g, '{"name": "A", "age": 3, "nick": "abc", "ok": true}',
                   '{"name":"A","age":120,"ok":false}',
                   '{ "name": "", "age": 0, "ok": true}') == [True, True, True]
    assert accepts(g, '{"age": 3, "name": "A", "ok": true}',  # out of schema order
                   '{"name": "A", "ok": true}',  # a required property missing
                   '{"name": "A", "age": 121, "ok": true}',  # above maximum
                   '{"name": "A", "age": -1, "ok": true}',
                   '{"name": "A", "age": 3, "nick": "abcd", "ok": true}',  # maxLength 3
                   '{"name": "A", "age": 3, "ok": true, "x": 1}',  # additionalProperties false
                   '{"name": "A", "age": 3,, "ok": true}') == [False] * 7


def test_only_optional_properties_and_absent_additional_properties():
    g = Grammar.json_schema({"properties": {"a": {"type": "null"}, "b": {"const": 2}}})
    assert accepts(g, '{}', '{"a": null}', '{"b": 2}', '{"a": null, "b": 2}') == [True] * 4
    # absent / true additionalProperties: only the listed properties are written (still valid for the schema)
    assert accepts(g, '{"c": 1}', '{, "b": 2}', '{"b": 3}') == [False] * 3


def test_maps_and_bare_objects():
    as_map = Grammar.json_schema({"type": "object", "additionalProperties": {"type": "integer"}})
    assert accepts(as_map, '{}', '{"x": 1, "y": 2}', '{"x": "1"}') == [True, True, False]
    bare = Grammar.json_schema({"type": "object"})
    assert accepts(bare, '{"x": [1, {"y": null}]}', '[]') == [True, False]
    closed = Grammar.json_schema({"type": "object", "additionalProperties": False})
    assert accepts(closed, '{}', '{"x": 1}') == [True, False]


def test_integer_bounds_as_zod_emits_them():
    g = Grammar.json_schema({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})
    assert accepts(g, "-9007199254740991", "9007199254740991", "0", "-1", "42") == [True] * 5
    assert accepts(g, "-9007199254740992", "9007199254740992", "1.5", "-0", "007") == [False] * 5
    ex = Grammar.json_schema({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 10.5})
    assert [n for n in range(-20, 30) if accepts(ex, str(n))[0]] == list(range(3, 11))


def test_unbounded_integers_have_at_most_sixteen_digits():
    g = Grammar.json_schema({"type": "integer"})
    assert accepts(g, "9" * 16, "-" + "9" * 16, "9" * 17) == [True, True, False]


def test_number_bounds_are_exact_decimals():
    g = Grammar.json_schema({"type": "number", "minimum": 0.5, "exclusiveMaximum": 2})
    assert accepts(g, "0.5", "0.50", "1", "1.999999", "0.6") == [True] * 5
    assert accepts(g, "0.49", "2", "2.0", "-1", "0") == [False] * 5
    neg = Grammar.json_schema({"type": "number", "exclusiveMinimum": -1.25, "maximum": 3.5})
    assert accepts(neg, "-1.24", "-0.1", "0", "3.5", "3.50") == [True] * 5
    assert accepts(neg, "-1.25", "-1.3", "3.51", "-0", "-0.0") == [False] * 5
    with pytest.raises(SchemaError) as err:
        Grammar.json_schema({"type": "integer", "minimum": 5, "maximum": 4})
    assert err.value.param == "schema"


def test_strings_count_characters_not_bytes():
    g = Grammar.json_schema({"type": "string", "minLength": 2, "maxLength": 3})
    assert accepts(g, '"ab"', '"\u00e9\u00e9\u00e9"', '"a\\n"', '"\\u00e9b"') == [True] * 4
    assert accepts(g, '"a"', '"abcd"', '"\u00e9\u00e9\u00e9\u00e9"') == [False] * 3


def test_enum_const_any_of_type_lists_and_arrays():
    assert accepts(Grammar.json_schema({"enum": ["red", 2, None]}), '"red"', "2", "null", '"blue"') == \
        [True, True, True, False]
    assert accepts(Grammar.json_schema({"anyOf": [{"type": "string"}, {"type": "null"}]}), '"x"', "null", "1") == \
        [True, True, False]
    assert accepts(Grammar.json_schema({"type": ["integer", "boolean"]}), "3", "true", '"3"') == [True, True, False]
    arr = Grammar.json_schema({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})
    assert accepts(arr, "[1]", "[1, 2]", "[ 1,2]", "[]", "[1, 2, 3]", "[1 ,2]") == [True] * 3 + [False] * 3


def test_refs_to_defs_and_definitions():
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/definitions/n"}},
              "required": ["a", "b"], "additionalProperties": False,
              "$defs": {"pt": {"type": "array", "items": {"$ref": "#/definitions/n"}, "maxItems": 2}},
              "definitions": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    assert accepts(Grammar.json_schema(schema), '{"a": [1, 2], "b": 3}', '{"a": [10], "b": 3}') == [True, False]
    with pytest.raises(SchemaError) as err:
        Grammar.json_schema({"type": "object", "properties": {"next": {"$ref": "#"}}})
    assert err.value.param == "schema.properties.next.$ref" and "recursive" in err.value.message


@pytest.mark.parametrize("schema,param", [
    ({"type": "string", "pattern": "^a+$"}, "schema.pattern"),
    ({"type": "string", "format": "email"}, "schema.format"),
    ({"not": {"type": "null"}}, "schema.not"),
    ({"oneOf": [{"type": "null"}]}, "schema.oneOf"),
    ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}}, "schema.properties.a.multipleOf"),
    ({"allOf": [{"type": "null"}, {"type": "null"}]}, "schema.allOf"),
    ({"type": "array", "items": [{"type": "null"}]}, "schema.items"),
    ({"type": "object", "properties": {}, "required": ["x"]}, "schema.required"),
    ({"type": "date"}, "schema.type"),
    ({"$ref": "#/components/x"}, "schema.$ref"),
    ({"type": "string", "minLength": -1}, "schema.minLength"),
])
def test_schema_error_names_the_keyword(schema, param):
    with pytest.raises(SchemaError) as err:
        Grammar.json_schema(schema)
    assert err.value.param == param


def test_response_format():
    assert compile_response_format({"type": "text"}) is None
    assert compile_response_format({"type": "json_object"}) == Grammar.json_object()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    got = compile_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                           "strict": True}})
    assert got == Grammar.json_schema(schema)  # interned: equal grammars built alike are equal
    for bad, param in [({"type": "xml"}, "response_format.type"),
                       ({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
                        "response_format.json_schema.name"),
                       ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                                        "pattern": "x"}}},
                        "response_format.json_schema.schema.pattern")]:
        with pytest.raises(SchemaError) as err:
            compile_response_format(bad)
        assert err.value.param == param


def test_grammar_is_frozen_and_composes():
    g = Grammar.literal("<tool_call>\n") + Grammar.json_schema({"enum": [1, 2]}) + Grammar.literal("\n</tool_call>")
    assert accepts(g, "<tool_call>\n2\n</tool_call>", "<tool_call>\n3\n</tool_call>") == [True, False]
    either = Grammar.any_of([Grammar.literal("yes"), Grammar.literal("no")])
    assert accepts(either, "yes", "no", "maybe") == [True, True, False]
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.term = either.term
    params = SamplingParams(grammar=either)
    assert hash(params) == hash(SamplingParams(grammar=Grammar.any_of([Grammar.literal("no"),
                                                                       Grammar.literal("yes")])))


# A hand-made vocabulary: id -> bytes (None: a special token no grammar spells; 9 is EOS).
VOCAB = [b'{', b'}', b'{"', b'"a', b'":', b' ', b'1', b'12', b'"', None, b'\xc3', b'\xa9', b'\xc3\xa9"', b'1}']
EOS = 9


def matcher(schema) -> GrammarMatcher:
    return GrammarMatcher(TokenMasks(Automaton(Grammar.json_schema(schema).term), TokenVocabulary(VOCAB)),
                          frozenset({EOS}))


def allowed_ids(m: GrammarMatcher) -> list[int]:
    return np.flatnonzero(m.allowed()).tolist()


def test_masks_follow_the_object_and_allow_eos_only_when_complete():
    m = matcher({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    steps = []
    for token in (0, 3, 4, 5, 7, 1):  # {  "a  ":  ␠  12  }
        steps.append(allowed_ids(m))
        m.advance(token)
    steps.append(allowed_ids(m))
    # After "12" more digits or '}' may follow but not EOS; after '}' nothing but EOS.
    assert steps == [[0, 2], [3, 5, 8], [4, 8], [5, 6, 7, 13], [6, 7, 13], [1, 6, 7, 13], [EOS]]
    assert m.is_accepting


def test_a_token_may_end_mid_character():
    m = matcher({"type": "string"})
    assert allowed_ids(m) == [3, 4, 8]  # '"a' and '":' open the string and begin it
    m.advance(8)  # "
    # Inside the string: '{"' and '1}' are a character then the closing quote or a character (both fine), 'é"'
    # a whole character then the end; the lone continuation byte a9 and '":' (a ':' after the end) are not.
    assert allowed_ids(m) == [0, 1, 2, 5, 6, 7, 8, 10, 12, 13]
    m.advance(10)  # the first byte of é
    assert allowed_ids(m) == [11]  # only its continuation byte
    m.advance(11)
    m.advance(8)
    assert allowed_ids(m) == [EOS]
    with pytest.raises(ValueError, match="does not continue the grammar"):
        m.advance(6)


def test_masked_sampler_never_draws_eos_early_and_masks_are_cached_by_state():
    grammar = Grammar.json_schema({"enum": [1, 12]})
    masks = TokenMasks(Automaton(grammar.term), TokenVocabulary(VOCAB))
    logits = np.zeros(len(VOCAB), np.float32)
    logits[EOS] = 50.0  # the model's favourite, refused until the value is complete
    drawn = []
    for seed in range(2):
        sampler = Sampler(SamplingParams(temperature=1.0, seed=seed, grammar=grammar),
                          GrammarMatcher(masks, frozenset({EOS})))
        assert not sampler.argmax_only and not sampler.on_device
        drawn.append((sampler.sample(logits), sampler.sample(logits)))
    # "1" or "12" (no token spells a lone "2", so after "1" only EOS remains), then EOS.
    assert [d[1] for d in drawn] == [EOS, EOS] and all(d[0] in (6, 7) for d in drawn)
    assert masks.hits >= 1  # the second sampler's first mask came from the cache
    with pytest.raises(ValueError, match="GrammarMatcher exactly when"):
        Sampler(SamplingParams(grammar=grammar))
