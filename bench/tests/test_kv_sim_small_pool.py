"""bench/kv_sim.py's Replay under a pool smaller than one conversation (a 1.5B model's KV pool in 1 GiB holds
3,136 tokens, the model's context 8,192): a turn that can never fit fails instead of waiting forever."""
from bench.kv_sim import Replay, SessionPlan, Turn, WorkloadConfig

CFG = WorkloadConfig(num_sessions=2, decode_tokens_per_s=10, warmup_s=0)
BPT = 100  # a budget of 64 * 100 B: 4 blocks of 16 tokens


def plans(first_answer: int) -> list[SessionPlan]:
    """Session 0: a 20 + 5 token prompt then first_answer tokens; session 1 arrives at 1 s, 10 + 5 + 20 tokens."""
    return [SessionPlan(0, list(range(1, 21)), [Turn(list(range(100, 105)), list(range(200, 200 + first_answer)))],
                        [3]),
            SessionPlan(1, list(range(300, 310)), [Turn(list(range(400, 405)), list(range(500, 520)))], [3])]


def run(first_answer: int) -> Replay:
    replay = Replay("paged", plans(first_answer), CFG, 64 * BPT, BPT, preempt=True)
    while not replay.done:
        replay.tick()
        assert replay.now < 100, "the replay did not end"
    return replay


def test_a_decode_past_the_whole_pool_fails_the_turn_even_when_waiting_is_allowed():
    replay = run(first_answer=50)  # 25 + 50 tokens > 64 slots: NeverFits once session 0 passes 64 tokens
    r = replay.result()
    assert [s.failed for s in replay.sessions] == [True, False]
    assert (r["turns_failed"], r["sessions_served"]) == (1, 1)
    assert r["max_context_tokens"] == 35  # session 1's 15 + 20 tokens


def test_a_turn_that_fits_waits_for_memory_instead():
    replay = run(first_answer=35)  # 60 tokens fit alone: session 1 waits for session 0's blocks or preempts it
    r = replay.result()
    assert [s.failed for s in replay.sessions] == [False, False]
    assert r["turns_failed"] == 0 and r["preemptions"] + r["deferred_ticks"] > 0
    assert r["max_context_tokens"] == 60
