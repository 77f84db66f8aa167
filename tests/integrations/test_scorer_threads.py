"""A reward in this process is called by one thread at a time (:meth:`finecap.integrations.scoring.Scorer.score`),
as the reward server calls its reward: verl's reward loop runs ``compute_score`` in a thread pool and OpenRLHF its
``reward_func`` in ``asyncio.to_thread``, and a reward need not be thread-safe (an in-process vLLM judge's engine is
not)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from finecap.integrations.scoring import Scorer
from finecap.rewards.cider import CiderReward

REFERENCES = {1: ["a red circle", "a small red circle"], 2: ["a blue square"]}


class MeetingCider(CiderReward):
    """CIDEr-D whose calls wait (at most ``patience`` seconds) for a second call to be inside it at the same time,
    and count the most calls inside at once."""

    def __init__(self, references, patience: float) -> None:
        super().__init__(references)
        self.meeting = threading.Barrier(2, timeout=patience)
        self.inside = self.most_inside = 0
        self.count = threading.Lock()

    def __call__(self, captions, batch):
        with self.count:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            self.meeting.wait()
        except threading.BrokenBarrierError:
            pass  # no second call came in (or the first gave up waiting for one)
        finally:
            with self.count:
                self.inside -= 1
        return super().__call__(captions, batch)


def test_a_reward_in_process_is_called_by_one_thread_at_a_time():
    reward = MeetingCider(REFERENCES, patience=1.0)
    scorer = Scorer.of(reward)
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda i: scorer.score(["a red circle", "a blue square"], [1, 2]), range(2)))
    assert reward.most_inside == 1
    assert [o.total.tolist() for o in outs] == [outs[0].total.tolist()] * 2
    assert outs[0].total[0] > 0 and outs[0].total[1] > 0


def test_a_pickled_scorer_in_process_has_a_lock_of_its_own():
    """verl's ``remote`` reward manager pickles the adapter into its workers: the lock is not pickled, the copy makes
    its own and scores as the original does."""
    import pickle

    scorer = Scorer.of(CiderReward(REFERENCES))
    copy = pickle.loads(pickle.dumps(scorer))
    assert copy._lock is not scorer._lock
    captions, ids = ["a red circle", "a blue square"], [1, 2]
    assert copy.score(captions, ids).total.tolist() == scorer.score(captions, ids).total.tolist()
