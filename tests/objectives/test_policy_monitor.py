"""The reward-hacking monitor (finecap.objectives.monitor): its measures by hand, the alarms of each measure in each
direction (warn once, or stop with one line naming the step and the measure), its state, and the world's fact
precision and recall of sampled captions."""

from __future__ import annotations

import logging

import pytest

from finecap.config import Config, ConfigError, GRPOConfig, RLConfig, load
from finecap.objectives.monitor import Monitor, RewardHackingAlarm, distinct_share, repetition
from finecap.world.scene import Obj, Scene


@pytest.mark.parametrize(
    ("text", "share"),
    [("a red circle a red circle", 1 / 4),  # trigrams: a-red-circle, red-circle-a, circle-a-red, a-red-circle
     ("a red circle and a red square", 0.0),  # words and pairs repeat, no trigram does
     ("a b c a b c a b c", 4 / 7),  # 7 trigrams, 3 distinct
     ("circle circle circle circle", 1 / 2),  # 2 trigrams, both "circle circle circle"
     ("a circle", 0.0), ("", 0.0)],
)  # fmt: skip
def test_repetition_is_the_share_of_repeated_trigrams(text, share):
    assert repetition(text) == pytest.approx(share)


def test_distinct_share_per_image():
    # image 0: 2 distinct of 3; image 1: 3 of 3 -> (2/3 + 1) / 2
    assert distinct_share(["a", "a", "b", "c", "d", "e"], 3) == pytest.approx(5 / 6)


def step(monitor, texts, step_no, ids=None):
    values = monitor.measure(texts, ids or list(range(len(texts))), step_no)
    monitor.end_step()
    return values


def test_length_drift_is_relative_to_the_first_step_and_survives_a_resume():
    m = Monitor(RLConfig(samples=2))
    assert step(m, ["a red circle", "a circle"], 1)["monitor/length_drift"] == 0.0  # first step: 2.5 words
    assert m.first_length == 2.5
    # (6 + 2) / 2 = 4 words: 4 / 2.5 - 1 = 0.6
    assert step(m, ["a big red circle on grass", "a circle"], 2)["monitor/length_drift"] == pytest.approx(0.6)
    resumed = Monitor(RLConfig(samples=2))
    resumed.load_state_dict(m.state_dict())
    assert step(resumed, ["a", "b"], 3)["monitor/length_drift"] == pytest.approx(1 / 2.5 - 1)
    with pytest.raises(ValueError, match="first_length"):
        resumed.load_state_dict({"first_length": -1.0})


def test_an_all_empty_first_step_leaves_the_length_alarm_on():
    # a fresh policy that stops at once: step 1's captions have no word, so the drift starts at step 2 (2 words);
    # the start was step 1's 0 words until 2026-11-28, and the drift and its alarm stayed 0 for the rest of the run
    m = Monitor(RLConfig(samples=2, alarms={"length_drift": 0.5}, alarm_action="stop"))
    assert step(m, ["", ""], 1)["monitor/length_drift"] == 0.0
    assert m.first_length is None and m.state_dict()["first_length"] is None
    assert step(m, ["a circle", "a square"], 2)["monitor/length_drift"] == 0.0 and m.first_length == 2.0
    with pytest.raises(RewardHackingAlarm, match=r"^rl.alarms: at step 3 the sampled captions' length_drift is 1,"):
        step(m, ["a big red circle", "a big blue square"], 3)  # 4 words: 4 / 2 - 1 = 1 > 0.5
    resumed = Monitor(RLConfig(samples=2, alarms={"length_drift": 0.5}, alarm_action="stop"))
    resumed.load_state_dict({"first_length": 0.0})  # saved after an all-empty first step before 2026-11-28
    assert resumed.first_length is None
    step(resumed, ["a circle", "a square"], 2)
    assert resumed.first_length == 2.0


@pytest.mark.parametrize(
    ("measure", "threshold", "texts"),
    [("length_drift", 0.5, ["a big red circle on grass", "one big red circle on green grass"]),  # longer: 6.5 / 2.5
     ("length_drift", 0.5, ["a", "b"]),  # shorter counts too: 1 / 2.5 - 1 = -0.6
     ("repetition", 0.2, ["a red circle a red circle", "a red circle a red circle"]),  # 1/4 each
     ("distinct", 0.8, ["a red circle", "a red circle"])],  # one distinct caption of two: 0.5
)  # fmt: skip
def test_each_alarm_stops_naming_the_step_and_the_measure(measure, threshold, texts):
    m = Monitor(RLConfig(samples=2, alarms={measure: threshold}, alarm_action="stop"))
    step(m, ["a red circle", "a circle"], 1)  # 2.5 words, no repetition, 2 distinct: nothing sounds
    with pytest.raises(RewardHackingAlarm, match=rf"^rl.alarms: at step 2 the sampled captions' {measure} is"):
        step(m, texts, 2)


def test_a_warning_alarm_warns_once_per_measure_and_training_goes_on(caplog):
    m = Monitor(RLConfig(samples=2, alarms={"repetition": 0.1, "length_drift": 10.0}))
    step(m, ["a b", "c d"], 1)
    with caplog.at_level(logging.WARNING, logger="finecap.objectives.monitor"):
        for n in (2, 3, 4):
            step(m, ["x y z x y z", "x y z x y z"], n)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "at step 2" in warnings[0] and "repetition" in warnings[0]


def test_a_resumed_run_does_not_warn_again_for_an_alarm_it_warned_about(caplog):
    # the measures warned about are the monitor's state (in the checkpoint), so a run killed after a warning and
    # resumed does not warn again; until 2026-11-28 only the first length was kept and the resumed run warned again
    alarms = {"repetition": 0.1, "length_drift": 10.0}
    m = Monitor(RLConfig(samples=2, alarms=alarms))
    step(m, ["a b", "c d"], 1)
    with caplog.at_level(logging.WARNING, logger="finecap.objectives.monitor"):
        step(m, ["x y z x y z", "x y z x y z"], 2)
    assert len(caplog.records) == 1
    state = m.state_dict()
    assert state == {"first_length": 2.0, "warned": ["repetition"], "failed_seen": False}
    caplog.clear()
    resumed = Monitor(RLConfig(samples=2, alarms=alarms))
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="finecap.objectives.monitor"):
        step(resumed, ["x y z x y z", "x y z x y z"], 3)
    assert caplog.records == []
    older = Monitor(RLConfig(samples=2, alarms=alarms))
    older.load_state_dict({"first_length": 2.0})  # a checkpoint from before 2026-11-28: nothing warned yet
    assert older.warned == set()
    for bad in (["nonsense"], "repetition", [1]):
        with pytest.raises(ValueError, match="monitor 'warned' must be a list of alarm measures"):
            Monitor(RLConfig(samples=2)).load_state_dict({"first_length": 2.0, "warned": bad})


def test_fact_precision_and_recall_on_the_world():
    scenes = {7: Scene(7, "grass", [Obj("circle", "red", "large", 1, 1)])}
    m = Monitor(RLConfig(samples=2, alarms={"fact_precision": 0.9}, alarm_action="stop"))
    m.scenes = scenes
    values = m.measure(["a red circle", "a blue circle"], [7, 7], 1)
    # "a red circle": object and colour true (precision 1); "a blue circle": circle true, blue false (0.5)
    assert values["monitor/fact_precision"] == pytest.approx(0.75)
    assert 0 < values["monitor/fact_recall"] < 1
    with pytest.raises(RewardHackingAlarm, match="fact_precision is 0.75, below its threshold 0.9"):
        m.end_step()


def test_fact_alarms_are_silent_off_the_world():
    m = Monitor(RLConfig(samples=1, alarms={"fact_recall": 1.0}, alarm_action="stop"))
    values = step(m, ["a red circle"], 1)
    assert "monitor/fact_recall" not in values  # no scene graphs: nothing measured, nothing sounds
    # (the configuration refuses this alarm off the world: test_an_alarm_that_could_never_sound_is_refused...)


def test_the_kl_alarm_reads_the_steps_kl_and_names_its_option():
    # The GRPO objective hands over the step's KL, the token mean over its global batch (10 tokens at 0.05 and 30 at
    # 0.3 are (0.5 + 9) / 40 = 0.2375; the token means themselves: tests/objectives/test_token_means.py), and the
    # alarm reads it as given; it is the value the step logs (Monitor.step_kl).
    m = Monitor(RLConfig(samples=2, alarms={"kl": 0.2}, alarm_action="stop"))
    m.measure(["a red circle", "a circle"], [0, 1], 1)
    m.end_step(kl=0.1125)  # below 0.2
    assert m.step_kl == 0.1125
    m.measure(["a red circle", "a circle"], [0, 1], 2)
    with pytest.raises(RewardHackingAlarm, match=r"^rl.alarms: at step 2 the KL to the starting policy "
                       r"\(rl.alarms.kl\) is 0.2375, above its threshold 0.2"):  # fmt: skip
        m.end_step(kl=0.2375)
    assert m.step_kl == 0.2375
    quiet = Monitor(RLConfig(samples=2, alarms={"repetition": 0.5}, alarm_action="stop"))
    quiet.measure(["a red circle", "a circle"], [0, 1], 1)
    quiet.end_step(kl=5.0)  # no kl alarm asked for: a large KL stops nothing


def test_the_kl_alarm_needs_the_kl_penalty_and_a_positive_threshold():
    with pytest.raises(ConfigError, match=r"rl.alarms.kl: needs grpo.kl_coef > 0") as e:
        load(None, ["rl.alarms={kl: 0.1}"])  # a check across sections: the rl section's, run on the whole config
    assert e.value.key == "rl.alarms.kl"
    with pytest.raises(ConfigError, match=r"rl.alarms.kl: needs grpo.kl_coef > 0"):
        Config(rl=RLConfig(alarms={"kl": 0.1}))
    with pytest.raises(ConfigError, match=r"rl.alarms.kl: must be > 0"):
        RLConfig(alarms={"kl": 0.0})
    kl = GRPOConfig(kl_coef=0.04, policy_loss="clipped")
    assert Config(rl=RLConfig(alarms={"kl": 2.5}), grpo=kl).rl.alarms == {"kl": 2.5}  # any size


@pytest.mark.parametrize(
    ("alarms", "overrides", "key", "message"),
    [({"distinct": 0.5}, ["rl.samples=1"], "rl.alarms.distinct", "needs rl.samples >= 2"),  # distinct: always 1
     ({"fact_precision": 0.8}, ["data.format=coco"], "rl.alarms.fact_precision", "needs data.format=world"),
     ({"fact_recall": 0.5}, ["data.format=jsonl"], "rl.alarms.fact_recall", "needs data.format=world"),  # no scenes
     # a threshold no value can cross: a share is never below 0, repetition (one distinct trigram) and failed never
     # above 1
     ({"distinct": 0}, [], "rl.alarms.distinct", "must be in (0, 1]"),
     ({"repetition": 1}, [], "rl.alarms.repetition", "must be in [0, 1)"),
     ({"failed": 1.0}, [], "rl.alarms.failed", "must be in [0, 1)"),
     ({"greedy_failed": 1.0}, [], "rl.alarms.greedy_failed", "must be in [0, 1)"),
     # no greedy captions to fail: another baseline, or GRPO's group mean
     ({"greedy_failed": 0.5}, ["rl.baseline=mean"], "rl.alarms.greedy_failed", "needs rl.baseline=greedy"),
     ({"greedy_failed": 0.5}, ["grpo.advantage=group"], "rl.alarms.greedy_failed", "needs rl.baseline=greedy")],
)  # fmt: skip
def test_an_alarm_that_could_never_sound_is_refused_naming_its_key(alarms, overrides, key, message):
    # each was accepted until 2026-12 and never sounded: the run looked watched and was not
    inline = "{" + ", ".join(f"{k}: {v}" for k, v in alarms.items()) + "}"
    with pytest.raises(ConfigError) as e:
        load(None, ["train.objective=reinforce", f"rl.alarms={inline}", *overrides])
    assert e.value.key == key and message in str(e.value), str(e.value)


def test_the_greedy_failed_alarm_reads_the_steps_share_of_greedy_captions_alone():
    # 2 of the step's 4 greedy captions failed, in two micro-batches, and none of its 8 samples: failed (of samples)
    # is 0, greedy_failed 0.5, past 0.4. Until 2026-11-29 no alarm read the greedy captions' failures, and a run whose
    # greedy baseline failed every time fell back to leave-one-out without a word
    m = Monitor(RLConfig(samples=2, alarms={"failed": 0.1, "greedy_failed": 0.4}, alarm_action="stop"))
    for failed in (2, 0):
        m.observe_failed(0, 4)
        m.observe_greedy_failed(failed, 2)
    with pytest.raises(RewardHackingAlarm, match=r"at step 1 the share of greedy captions a reward could not score "
                       r"\(rl.alarms.greedy_failed\) is 0.5, above its threshold 0.4: the reward could not score "
                       r"them \(a judge that failed\?\), and their images' samples took the mean of the image's other "
                       r"samples as baseline"):  # fmt: skip
        step(m, ["a red circle", "a circle"], 1)
    assert m.failed_share is None and m.greedy_failed_share == 0.5
    quiet = Monitor(RLConfig(samples=2, alarms={"greedy_failed": 0.4}, alarm_action="stop"))
    quiet.observe_greedy_failed(1, 4)  # 0.25: below
    step(quiet, ["a red circle", "a circle"], 1)
    assert quiet.greedy_failed_share == 0.25
    step(quiet, ["a red circle", "a circle"], 2)  # a step with no greedy captions (an objective without): no share
    assert quiet.greedy_failed_share is None


def test_each_alarm_message_says_what_crossed_and_why_it_matters():
    # a shorter drift crosses by its size: the message said "-0.6, above its threshold 0.5" until 2026-12
    m = Monitor(RLConfig(samples=2, alarms={"length_drift": 0.5}, alarm_action="stop"))
    step(m, ["a red circle", "a circle"], 1)  # 2.5 words
    with pytest.raises(RewardHackingAlarm, match=r"length_drift is -0.6, its size above its threshold 0.5: the policy "
                       "may be exploiting the reward"):  # fmt: skip
        step(m, ["a", "b"], 2)  # 1 word: 1 / 2.5 - 1
    # captions a reward could not score are the reward's failures, not the policy exploiting it
    f = Monitor(RLConfig(samples=2, alarms={"failed": 0.1}, alarm_action="stop"))
    f.observe_failed(1, 2)
    with pytest.raises(RewardHackingAlarm, match=r"\(rl.alarms.failed\) is 0.5, above its threshold 0.1: the reward "
                       r"could not score them \(a judge that failed\?\); training stopped") as e:  # fmt: skip
        step(f, ["a red circle", "a circle"], 1)
    assert "exploiting" not in str(e.value)
