"""The reward server's requests: both shapes read into one request, every malformed field named (400), every limit
named (413), nothing in a request ever run: plain JSON, each value checked for its type."""

from __future__ import annotations

import json

import pytest

from finecap.serve.protocol import (
    Limits,
    RequestError,
    caption_of_query,
    decode_json,
    parse_get_reward,
    parse_reward,
)

LIMITS = Limits(max_request_bytes=1000, max_captions=4, max_caption_chars=20)


def refused(parse, body, limits=LIMITS) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse(body, limits)
    return caught.value


def test_finecap_request_with_ids_paths_references_and_an_echoed_id():
    got = parse_reward({"id": "step-3", "captions": ["a red circle", "a square"], "image_ids": [7, "8"]}, LIMITS)
    assert (got.captions, got.image_ids, got.by_path, got.references, got.request_id) == (
        ["a red circle", "a square"], [7, "8"], False, None, "step-3")  # fmt: skip
    got = parse_reward({"captions": ["a"], "images": ["/data/0.png"], "references": [["a red circle"]]}, LIMITS)
    assert (got.image_ids, got.by_path, got.references, got.request_id) == (["/data/0.png"], True,
                                                                           [["a red circle"]], None)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ([1, 2], "body", "expected a JSON object, got an array"),
        ({"captions": ["a"], "image_ids": [1], "image_id": [1]}, "image_id", "unknown field"),
        ({"image_ids": [1]}, "captions", "missing"),
        ({"captions": "a red circle", "image_ids": [1]}, "captions", "expected an array of strings, got a string"),
        ({"captions": [], "image_ids": []}, "captions", "is empty"),
        ({"captions": ["a", 3], "image_ids": [1, 2]}, "captions[1]", "expected a string, got a number"),
        ({"captions": ["a"]}, "image_ids", "missing"),
        ({"captions": ["a"], "image_ids": [1], "images": ["x.png"]}, "images", "not both"),
        ({"captions": ["a", "b"], "image_ids": [1]}, "image_ids", "has 1 entries for 2 captions"),
        ({"captions": ["a"], "image_ids": [1.5]}, "image_ids[0]", "got a number"),
        ({"captions": ["a"], "image_ids": [True]}, "image_ids[0]", "got a boolean"),
        ({"captions": ["a"], "image_ids": [{"__reduce__": "os.system"}]}, "image_ids[0]", "got an object"),
        ({"captions": ["a"], "images": [3]}, "images[0]", "expected a string"),
        ({"captions": ["a"], "image_ids": [1], "references": [[]]}, "references[0]", "non-empty array"),
        ({"captions": ["a"], "image_ids": [1], "references": [["x", 2]]}, "references[0][1]", "expected a string"),
        ({"captions": ["a"], "image_ids": [1], "references": [["x"], ["y"]]}, "references", "has 2 entries"),
        ({"id": {"a": 1}, "captions": ["a"], "image_ids": [1]}, "id", "expected a JSON scalar"),
    ],
)
def test_each_malformed_finecap_field_is_named(body, field, words):
    error = refused(parse_reward, body)
    assert (error.field, error.status) == (field, 400) and words in error.message
    assert error.body() == {"error": {"field": field, "message": error.message}}


def test_limits_are_413_naming_the_field():
    error = refused(parse_reward, {"captions": ["a"] * 5, "image_ids": [1] * 5})
    assert (error.field, error.status) == ("captions", 413) and "--max-captions" in error.message
    error = refused(parse_reward, {"captions": ["a" * 21], "image_ids": [1]})
    assert (error.field, error.status) == ("captions[0]", 413) and "21 characters" in error.message
    error = refused(parse_reward, {"captions": ["a"], "image_ids": [1], "references": [["r" * 21]]})
    assert (error.field, error.status) == ("references[0][0]", 413)
    error = refused(parse_get_reward, {"query": ["q"] * 5, "labels": [1] * 5})
    assert (error.field, error.status) == ("query", 413)
    with pytest.raises(ValueError, match="--max-captions: must be at least 1"):
        Limits(max_captions=0)


def test_a_lone_surrogate_is_refused_naming_its_field():
    """JSON's ``"\\ud800"`` escape is valid JSON but reads as a lone surrogate, no Unicode text: a caption holding one
    reached the reward, whose tokenizer failed on it (a 500 blamed on the reward); it is the client's, a 400 naming the
    field, in every text a request holds. A surrogate pair is one character and passes."""
    raw = b'{"captions": ["a", "b \\ud83d\\ude00"], "image_ids": [1, 2]}'
    assert parse_reward(decode_json(raw), LIMITS).captions == ["a", "b \U0001f600"]
    lone = "b \ud800"
    cases = [
        (parse_reward, {"captions": ["a", lone], "image_ids": [1, 2]}, "captions[1]"),
        (parse_reward, {"captions": ["a"], "image_ids": [1], "references": [["x", lone]]}, "references[0][1]"),
        (parse_reward, {"captions": ["a"], "images": [lone]}, "images[0]"),
        (parse_get_reward, {"query": [lone], "labels": [1]}, "query[0]"),
        (parse_get_reward, {"query": ["a"], "prompts": [lone], "labels": [1]}, "prompts[0]"),
        (parse_get_reward, {"query": ["a"], "labels": [{"image_id": 1, "references": ["x", lone]}]},
         "labels[0].references[1]"),  # the label's references[1] (was labels[0].references[0][1])
    ]  # fmt: skip
    for parse, body, field in cases:
        error = refused(parse, body)
        assert (error.field, error.status) == (field, 400), error
        assert "lone surrogate (\\ud800 at character 2)" in error.message
    error = refused(parse_reward, decode_json(b'{"captions": ["\\udc00"], "image_ids": [1]}'))
    assert error.field == "captions[0]" and "\\udc00 at character 0" in error.message


def test_bodies_are_plain_json_only():
    assert decode_json(b'{"captions": ["a"]}') == {"captions": ["a"]}
    deep = b"[" * 100_000 + b"]" * 100_000
    bad = [(b"{bad", "not valid JSON"), (b"\xff\xfe", "not valid JSON"), (b"[NaN]", "NaN is not JSON"),
           (deep, "not valid JSON"), (b"!!python/object:os.system", "not valid JSON"),
           (b'{"captions": ["a"], "image_ids": [1], "captions": ["b"]}', "not valid JSON: duplicate key 'captions'"),
           (b'{"captions": [{"x": 1, "x": 2}]}', "duplicate key 'x'"), (b"[-Infinity]", "-Infinity is not JSON"),
           (b"{bad", "not valid JSON at line 1, column 2"),
           (b'{"image_ids": [' + b"9" * 5000 + b"]}", "not valid JSON: a number too long to read")]  # fmt: skip
    for raw, words in bad:
        with pytest.raises(RequestError) as caught:
            decode_json(raw)
        assert caught.value.field == "body" and words in caught.value.message


def test_a_body_that_is_no_utf8_is_refused_as_such():
    # a Latin-1 caption was answered "not valid JSON: invalid start byte", which named neither UTF-8 nor the fix
    with pytest.raises(RequestError) as caught:
        decode_json('{"captions": ["café"], "image_ids": [1]}'.encode("latin-1"))
    assert (caught.value.field, caught.value.status) == ("body", 400)
    assert caught.value.message == "not UTF-8 text (invalid continuation byte): send the JSON encoded as UTF-8"
    assert decode_json('{"captions": ["café"]}'.encode()) == {"captions": ["café"]}


def test_the_caption_of_an_openrlhf_query_follows_its_prompt_without_end_tokens():
    prompt = "<|im_start|>user\n<image>Describe the image.<|im_end|>\n<|im_start|>assistant\n"
    assert caption_of_query(prompt + "A red circle on sand.<|im_end|><|endoftext|>", prompt) == "A red circle on sand."
    assert caption_of_query("<s>[INST] Describe [/INST] a square </s>", "[INST] Describe [/INST]") == "a square"
    assert caption_of_query("a red circle<|eot_id|>", None) == "a red circle"  # no prompt: the query is the response
    # a prompt the query does not hold is refused: the whole query would score the prompt's text as the caption's
    with pytest.raises(ValueError, match="the prompt is not in the query"):
        caption_of_query("a red circle", "an absent prompt")


def test_a_multimodal_prompt_whose_image_placeholder_the_query_expands_gives_the_response():
    # Qwen-VL's prompt holds one <|image_pad|>, the decoded query one per image patch: the response follows the
    # longest end of the prompt the query holds (it was the whole chat text, scored as the caption)
    prompt = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n"
              "<|im_start|>assistant\n")  # fmt: skip
    query = prompt.replace("<|image_pad|>", "<|image_pad|>" * 4) + "a red circle<|im_end|>"
    assert caption_of_query(query, prompt) == "a red circle"
    assert caption_of_query(" " + prompt[3:] + "a square</s>", prompt) == "a square"  # a decode changed its start
    body = {"query": [query, "a red circle"], "prompts": [prompt, "an absent prompt"], "labels": [7, 8]}
    with pytest.raises(RequestError) as caught:
        parse_get_reward(body, Limits())
    assert caught.value.field == "prompts[1]" and "not in the query" in caught.value.message


def test_openrlhf_labels_carry_ids_objects_paths_and_references():
    body = {"query": ["P: a red circle</s>", "P: a square</s>"], "prompts": ["P:", "P:"], "labels": [7, "8"],
            "datasources": ["x", "x"]}  # fmt: skip
    got = parse_get_reward(body, LIMITS)
    assert (got.captions, got.image_ids, got.by_path, got.references) == (["a red circle", "a square"], [7, "8"],
                                                                         False, None)  # fmt: skip
    labels = [json.dumps({"image_id": 7, "references": ["a red circle"]}), {"image_id": "8", "references": ["x"]}]
    got = parse_get_reward({"query": ["a", "b"], "labels": labels}, LIMITS)
    assert (got.image_ids, got.references) == ([7, "8"], [["a red circle"], ["x"]])
    got = parse_get_reward({"query": ["a"], "labels": ['{"image": "/w/0.png"}']}, LIMITS)
    assert (got.image_ids, got.by_path) == (["/w/0.png"], True)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"labels": [1]}, "query", "missing"),
        ({"query": ["a"]}, "labels", "missing"),
        ({"query": ["a"], "labels": 1}, "labels", "expected an array"),
        ({"query": ["a", "b"], "labels": [1]}, "labels", "has 1 entries for 2 queries"),
        ({"query": ["a"], "prompts": ["p", "q"], "labels": [1]}, "prompts", "has 2 entries"),
        ({"query": ["a"], "labels": ["{not json"]}, "labels[0]", "must be a JSON object"),
        ({"query": ["a"], "labels": [{"image_id": 1, "answer": 2}]}, "labels[0].answer", "unknown key"),
        ({"query": ["a"], "labels": [{"references": ["x"]}]}, "labels[0]", "image_id or image"),
        ({"query": ["a"], "labels": [[1]]}, "labels[0]", "expected an image id"),
        ({"query": ["a", "b"], "labels": [1, {"image": "p.png"}]}, "labels", "not a mix"),
        ({"query": ["a", "b"], "labels": [{"image_id": 1, "references": ["x"]}, 2]}, "labels[1]", "no references"),
        ({"query": ["a"], "labels": [{"image_id": 1, "references": []}]}, "labels[0].references", "non-empty array"),
        ({"query": ["a"], "labels": [{"image_id": 1, "references": ["x", 2]}]}, "labels[0].references[1]", "a string"),
    ],
)
def test_each_malformed_openrlhf_field_is_named(body, field, words):
    error = refused(parse_get_reward, body)
    assert (error.field, error.status) == (field, 400) and words in error.message


def test_a_get_reward_prompts_count_is_said_against_the_queries():
    # prompts of another length than the queries were refused "has 2 entries for 1 captions": /get_reward's caller
    # sent queries, no captions (its labels' count is said per query too)
    error = refused(parse_get_reward, {"query": ["a"], "prompts": ["p", "q"], "labels": [1]})
    assert (error.field, error.message) == ("prompts", "has 2 entries for 1 queries")
