"""The reward service without HTTP: images by id or path, the batching of concurrent requests (merged into one
reward call only for rewards that score each caption alone, and then bit for bit the values of separate calls), a
bad request failing alone, and the refusal of one-image requests for rewards that compare a call's images."""

from __future__ import annotations

import asyncio

import pytest
import torch

from finecap.rewards import RewardOutput
from finecap.serve.protocol import RequestError, RewardRequest
from finecap.serve.service import ImageTable, RewardFailed, RewardService


class Counting:
    """Each caption's length in words; counts its calls; refuses the caption "boom" (a ValueError)."""

    def __init__(self, per_caption: bool) -> None:
        self.per_caption = per_caption
        self.calls: list[int] = []

    def __call__(self, captions, batch):
        self.calls.append(len(captions))
        if "boom" in captions:
            raise ValueError("caption 'boom' is refused")
        if "bug" in captions:
            raise RuntimeError("a bug")
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"length": total})


def request(*captions: str, ids=None) -> RewardRequest:
    return RewardRequest(list(captions), list(ids or range(len(captions))))


def run_concurrently(service: RewardService, requests: list[RewardRequest]) -> list:
    async def go():
        async with service.running():
            return await asyncio.gather(*(service.score(service.job(r)) for r in requests), return_exceptions=True)

    return asyncio.run(go())


def test_images_by_id_text_or_path(tmp_path):
    (tmp_path / "w").mkdir()
    image = tmp_path / "w" / "0.png"
    image.write_bytes(b"")
    table = ImageTable([17, "a"], {"/w/0.png": 17, str(image.resolve()): 17}, "the 2 images of a test")
    assert table.resolve(["17", 17, "a"], False, "image_ids") == [17, 17, "a"]
    other_name = str(tmp_path / "w" / ".." / "w" / "0.png")
    assert table.resolve(["/w/0.png", other_name], True, "images") == [17, 17]  # resolved when not as named
    with pytest.raises(RequestError, match=r"^images\[0\]: unknown image file '/w/../w/0.png'"):
        table.resolve(["/w/../w/0.png"], True, "images")  # names no file: nothing to resolve (real_path)
    with pytest.raises(RequestError, match=r"^image_ids\[1\]: unknown image id 18: the server scores the 2 images"):
        table.resolve([17, 18], False, "image_ids")
    with pytest.raises(RequestError, match=r"^images\[0\]: unknown image file '/w/1.png'"):
        table.resolve(["/w/1.png"], True, "images")
    from finecap.data.formats import Record

    records = [Record(5, tmp_path / "img" / "5.png", "train", ["a"])]
    assert ImageTable.of_records(records).resolve([str(tmp_path / "img" / "5.png")], True, "images") == [5]


def test_an_image_path_costs_one_file_system_lookup_whatever_it_holds(tmp_path, monkeypatch):
    """A path not known as written was resolved by Python (Path.resolve), which asks the file system about each of
    its components in turn: a 16 MiB request of 839 paths ``/tmp/..`` x 2850 + a known image's path held a check
    thread 18 s (a loaded 2-core machine), a few such requests every check thread, each trainer's request waiting
    behind them. The kernel now resolves each in one call (real_path): here 1,000 components, one lookup."""
    import os

    image = tmp_path / "0.png"
    image.write_bytes(b"")
    table = ImageTable([17], {str(image.resolve()): 17})
    long_way = "/tmp/.." * 500 + str(image.resolve())  # 1,000 components before the image's own, under 4096 bytes
    calls: list[str] = []
    for name in ("lstat", "stat", "open", "readlink"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    assert table.resolve([long_way] * 10, True, "images") == [17] * 10
    assert len(calls) <= 2 * 10, calls[:10]  # an open and a readlink a path (Path.resolve: 1,000 lstat calls a path)


def test_image_paths_are_resolved_never_read(tmp_path):
    """What an image path may name on a shared machine: a link to a served image is that image (the server reads no
    file: the link's name is another name of it); a FIFO (no writer: opening it to read blocks for ever), a device
    (``/dev/zero``: endless), a directory and a path longer than the kernel's 4096 bytes are unknown images,
    answered at once."""
    import os
    import threading

    image = tmp_path / "0.png"
    image.write_bytes(b"")
    (tmp_path / "link.png").symlink_to(image)
    os.mkfifo(tmp_path / "fifo")
    table = ImageTable([17], {str(image.resolve()): 17})
    refused: list[str] = []

    def ask() -> None:
        for path in (str(tmp_path / "fifo"), "/dev/zero", str(tmp_path), "/tmp/" + "x/.." * 1500 + str(image)):
            with pytest.raises(RequestError, match=r"^images\[0\]: unknown image file"):
                table.resolve([path], True, "images")
            refused.append(path)

    asker = threading.Thread(target=ask, daemon=True)  # a FIFO opened for reading would hold it for ever
    asker.start()
    asker.join(30)
    assert len(refused) == 4, refused
    assert table.resolve([str(tmp_path / "link.png")], True, "images") == [17]


def test_concurrent_requests_of_a_per_caption_reward_are_merged_up_to_the_batch_size():
    reward = Counting(per_caption=True)
    service = RewardService(reward, ImageTable(range(10)), batch_size=4)
    got = run_concurrently(service, [request("a b", "c"), request("d e f"), request("g", "h", "i j"), request("k")])
    assert [s.total.tolist() for s in got] == [[2.0, 1.0], [3.0], [1.0, 1.0, 2.0], [1.0]]
    assert {k: v.tolist() for k, v in got[0].parts.items()} == {"length": [2.0, 1.0]}
    assert reward.calls == [3, 4]  # all queued before the worker's first round: 2 + 1 captions, then 3 + 1
    assert (service.meter.total_scored, service.meter.total_captions) == (4, 7)


def test_requests_of_other_rewards_are_called_one_by_one():
    reward = Counting(per_caption=False)
    service = RewardService(reward, ImageTable(range(10)))
    got = run_concurrently(service, [request("a b", "c"), request("d e f"), request("g")])
    assert [s.total.tolist() for s in got] == [[2.0, 1.0], [3.0], [1.0]] and reward.calls == [2, 1, 1]


def test_a_bad_request_fails_alone_and_the_service_goes_on():
    """Whatever the reward raises, a ValueError too, is the server's fault (the request was checked before): a
    RewardFailed (500) in finecap's words, never the reward's message; the other requests are answered."""
    reward = Counting(per_caption=True)
    service = RewardService(reward, ImageTable(range(10)))
    got = run_concurrently(service, [request("a b"), request("boom"), request("bug"), request("c")])
    assert got[0].total.tolist() == [2.0] and got[3].total.tolist() == [1.0]
    for failed in got[1:3]:
        assert isinstance(failed, RewardFailed) and not isinstance(failed, RequestError)  # answered 500
        assert "internal error: the reward reward failed on this request" in str(failed)
        assert "boom" not in str(failed) and "a bug" not in str(failed)
    assert reward.calls == [4, 1, 1, 1, 1]  # the merged call failed, then each request alone


class OnePerImage:
    """A reward breaking the contract: one value per distinct image of the call, not per caption."""

    per_caption = True

    def __call__(self, captions, batch):
        return RewardOutput(torch.tensor([float(i) for i in dict.fromkeys(batch["image_ids"])]))


def test_a_reward_giving_other_than_one_value_per_caption_fails_its_request_alone():
    # merged, request A (3 captions, 2 images) got B's image's value and B nothing; both were answered 200
    service = RewardService(OnePerImage(), ImageTable(range(10)))
    got = run_concurrently(service, [request("a", "b", "c", ids=[1, 1, 2]), request("d", ids=[3])])
    assert isinstance(got[0], RewardFailed) and got[1].total.tolist() == [3.0]
    from finecap.integrations.scoring import Scorer

    with pytest.raises(ValueError, match=r"total has shape \(2,\) for 3 captions"):
        Scorer(OnePerImage(), name="one per image").score(["a", "b", "c"], [1, 1, 2])


def test_a_reward_comparing_the_calls_images_refuses_a_request_of_one_image():
    reward = Counting(per_caption=False)
    reward.compares_images = True
    service = RewardService(reward, ImageTable(range(10)))
    with pytest.raises(RequestError, match=r"^image_ids: names one distinct image; .* sr.distractors=hard"):
        service.job(request("a", "b", ids=[3, 3]))
    assert service.job(request("a", "b", ids=[3, 4])).image_ids == [3, 4]


def test_a_call_of_one_image_written_as_an_int_and_its_string_is_refused_without_an_image_table():
    # a reward that names no images (known_images() None: no table, ids passed on as given) and compares the call's:
    # [3, "3"] passed the check as two images, though call_batch reads them as one (records.id_text), so the reward
    # ranked each caption's image among that one image alone
    from finecap.rewards import call_batch
    from finecap.serve.service import CallCheck

    assert call_batch([3, "3"])["image_ids"] == [3]  # the one image the reward would be called with
    check = CallCheck(None, compares=True, name="the reward")
    with pytest.raises(RequestError, match=r"^image_ids: names one distinct image; the reward ranks"):
        check.job(request("a", "b", ids=[3, "3"]))
    assert check.job(request("a", "b", ids=[3, "4"])).image_ids == [3, "4"]


def test_a_get_reward_requests_unknown_or_single_image_is_refused_naming_its_labels(tmp_path):
    # /get_reward's images travel in its labels; its refusals named image_ids[i] or images[i], fields it has not
    from finecap.serve.protocol import Limits, parse_get_reward

    image = tmp_path / "0.png"
    image.write_bytes(b"")
    comparing = Counting(per_caption=False)
    comparing.compares_images = True  # ranks each caption's image among the call's: one image is refused

    def job(labels, reward=None):
        service = RewardService(reward or Counting(per_caption=True), ImageTable(range(10), {str(image): 3}))
        return service.job(parse_get_reward({"query": ["a"] * len(labels), "labels": labels}, Limits()))

    with pytest.raises(RequestError, match=r"^labels\[1\]: unknown image id 99: the server scores"):
        job([3, 99])
    with pytest.raises(RequestError, match=r"^labels\[1\]: unknown image file '/etc/passwd'"):
        job([{"image": str(image)}, '{"image": "/etc/passwd"}'])
    with pytest.raises(RequestError, match=r"^labels: names one distinct image"):
        job([{"image_id": 3}, "3"], comparing)
    assert job([3, {"image_id": 4}], comparing).image_ids == [3, 4]
    assert job([{"image": str(image)}]).image_ids == [3]


def test_a_requests_own_field_names_word_its_image_refusals_whatever_their_shape():
    # a request's images were named by one name of their own (images_field), a second mechanism beside the adapters'
    # map of field names: a caller whose names are not "<name>[i]" (verl's extra_infos[i].image_id, its one sample's
    # extra_info.image_id) could not be named. RewardRequest.fields is that map (callers_field), applied by the check
    from finecap.serve.protocol import one_sample_fields

    comparing = Counting(per_caption=False)
    comparing.compares_images = True
    batch = {"captions": "solution_strs", "image_ids": "extra_infos[].image_id"}
    one = one_sample_fields({"captions": "solution_str", "image_ids": "extra_info.image_id"})

    def job(ids, fields, reward=None):
        service = RewardService(reward or Counting(per_caption=True), ImageTable(range(10)))
        return service.job(RewardRequest(["a"] * len(ids), ids, fields=fields))

    with pytest.raises(RequestError, match=r"^extra_infos\[1\]\.image_id: unknown image id 99: the server scores"):
        job([3, 99], batch)
    with pytest.raises(RequestError, match=r"^extra_info\.image_id: unknown image id 99: ") as caught:
        job([99], one)
    assert caught.value.field == "extra_info.image_id"
    with pytest.raises(RequestError, match=r"^extra_infos: names one distinct image"):
        job([3, "3"], batch, comparing)
    with pytest.raises(RequestError, match=r"^image_ids\[1\]: unknown image id 99: "):
        job([3, 99], None)  # no map: the /reward request's own names
    assert job([3, 4], batch, comparing).image_ids == [3, 4]


def test_the_service_must_be_running_and_stops_cleanly():
    service = RewardService(Counting(True), ImageTable(range(3)))
    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(service.score(service.job(request("a"))))
    assert run_concurrently(service, []) == []  # started and stopped twice: the worker and its thread end
    assert isinstance(run_concurrently(service, [request("a")])[0], RewardOutput)
    with pytest.raises(ValueError, match="--batch-size: must be from 1 to 1,000,000, got 0"):
        RewardService(Counting(True), ImageTable([1]), batch_size=0)


def test_merged_cider_calls_are_bit_identical_to_separate_ones(served):
    service = served["cider"]
    jobs = [service.job(RewardRequest(c, i)) for c, i in served["groups"]]
    merged = service.score_now(jobs)
    alone = [service.score_now([j])[0] for j in jobs]
    assert [m.total.tolist() for m in merged] == [a.total.tolist() for a in alone]
    assert [{k: v.tolist() for k, v in m.parts.items()} for m in merged] == [
        {k: v.tolist() for k, v in a.parts.items()} for a in alone
    ]


def test_references_of_a_request_replace_the_images_own_with_the_corpus_document_frequencies(served):
    """A request's references score CIDEr-D against them, the document frequencies still the training corpus's: an
    image's own training references give its values without them, and another image's references give the values of
    the caption said of that image (two paths: the references of the request, the scorer's table)."""
    service = served["cider"]
    captions, ids = served["groups"][4]
    own = {r.image_id: r.captions for r in served["records"]}

    def scored(image_ids, references=None):
        return service.score_now([service.job(RewardRequest(captions, image_ids, references=references))])[
            0
        ].total.tolist()

    plain = scored(ids)
    assert scored(ids, [own[i] for i in ids]) == pytest.approx(plain, abs=1e-6) and max(plain) > 1.0
    neighbours = [ids[(n + 1) % len(ids)] for n in range(len(ids))]
    assert scored(ids, [own[i] for i in neighbours]) == pytest.approx(scored(neighbours), abs=1e-6)
    assert scored(neighbours) != pytest.approx(plain, abs=1e-3)


def test_the_served_reward_is_built_without_a_training_context_or_an_accelerator(served, monkeypatch):
    """``finecap serve-reward`` sets its reward up from its records (``RewardInputs.of_run``): building one with
    ``TrainContext`` and ``Accelerator`` made unusable gives the served values."""
    import accelerate

    from finecap.app.serve_reward import load_reward
    from finecap.contract import TrainContext
    from finecap.rewards import call_batch

    def refused(*args, **kwargs):
        raise AssertionError("the reward server built a training context or an accelerator")

    monkeypatch.setattr(TrainContext, "__init__", refused)
    monkeypatch.setattr(accelerate.Accelerator, "__init__", refused)
    reward, records = load_reward(served["cfg"])
    assert len(records) == len(served["records"])
    captions, ids = served["groups"][0]
    expected = served["mix"].reward(captions, call_batch(ids)).total
    assert torch.equal(reward(captions, call_batch(ids)).total, expected)


def test_the_meter_keeps_a_bounded_number_of_latencies():
    # with --log-every 0 no line is logged until the server stops: the latencies once grew by one a request for ever
    from finecap.serve.service import LATENCIES_KEPT, Meter

    meter = Meter(0)
    for n in range(LATENCIES_KEPT + 10):
        meter.scored(1, n / 1000)
    assert len(meter.latencies) == LATENCIES_KEPT and meter.latencies[0] == 10 / 1000  # the last ones
    assert "latency p50" in meter.line("r") and len(meter.latencies) == 0
    # a window without any scored request (a server stopped before its first, or every client left): no "nan ms"
    assert meter.line("r").endswith("of the time; no request scored")


@pytest.mark.parametrize(("ids", "shown"), [([1, "1"], "1 and '1'"), ([2, 2.0], "2 and 2.0"), ([3, 3], "3 and 3")])
def test_an_image_keyed_twice_is_refused_by_the_one_rule_of_repeated_ids(ids, shown):
    # the table said its own "image ids 1 and '1' read the same in a request", where every other keyed input says
    # refuse_repeated_ids' message; and took 2 and 2.0, or one id twice, without a word (2 == 2.0)
    said = rf"^the 2 images of a test: 1 image\(s\) keyed twice, e\.g\. {shown} \(an int id and its string are one id"
    with pytest.raises(ValueError, match=said):
        ImageTable(ids, source="the 2 images of a test")
    with pytest.raises(ValueError, match=r"^the reward's images: 1 image\(s\) keyed twice"):
        ImageTable(iter(ids))
