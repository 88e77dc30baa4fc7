from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch

from maze_env import MazeGame, generate
from maze_env.actions import parse_action
from maze_env.prompts import feedback_message, initial_messages
from maze_env.render import Renderer, token_aligned_style
from maze_policy.chat import Trajectory
from maze_policy.lora import apply_lora, lora_config
from maze_policy.policy import Policy, policy_logprobs, policy_logprobs_and_entropy
from maze_policy.sampling import SamplingParams


def _start(
    policy: Policy, spec: str = "5x5", seed: int = 1
) -> tuple[Trajectory, MazeGame, Renderer]:
    maze = generate(spec, seed)
    r = Renderer(maze, token_aligned_style())
    game = MazeGame.start(maze)
    return policy.encoder.start(initial_messages(maze, game.step_budget, renderer=r)), game, r


def _rollout(
    policy: Policy, params: SamplingParams, turns: int, seeds: list[int]
) -> list[Trajectory]:
    """Multi-turn sampling for several mazes at once, appending replies and feedback turns."""
    states = [_start(policy, seed=s) for s in seeds]
    tok: Any = policy.processor.tokenizer
    for turn in range(turns):
        gens = policy.generate([s[0] for s in states], params, seed=100 + turn)
        for (traj, game, r), g in zip(states, gens, strict=True):
            policy.encoder.add_assistant(traj, g.token_ids, g.logprobs)
            res = game.step(tok.decode(g.token_ids)) if not game.done else None
            if res is not None and not game.done:
                policy.encoder.add_user(traj, feedback_message(res, game.agent, game.steps_left, r))
    return [s[0] for s in states]


def test_generation_never_emits_vision_tokens(tiny_policy: Policy) -> None:
    model: Any = tiny_policy.model
    vision = [i for i in tiny_policy.suppress_ids if i < len(tiny_policy.processor.tokenizer)]  # pyright: ignore[reportAttributeAccessIssue]
    assert tiny_policy.encoder.image_token_id in vision
    # Make vision tokens the model's favourite output, then check suppression still holds.
    boost = torch.tensor(vision)

    def favour_vision(_m: Any, _i: Any, out: torch.Tensor) -> torch.Tensor:
        return out.index_add(-1, boost, torch.full((*out.shape[:-1], len(vision)), 50.0))

    hook = model.lm_head.register_forward_hook(favour_vision)
    try:
        traj, _, _ = _start(tiny_policy)
        raw = model(**tiny_policy.encoder.model_inputs(traj)).logits[0, -1].argmax()
        assert int(raw) in vision  # without suppression a vision token would win
        for params in (
            SamplingParams(greedy=True, max_new_tokens=12),
            SamplingParams(temperature=1.5, max_new_tokens=12),
        ):
            (g,) = tiny_policy.generate([traj], params, seed=0)
            assert len(g.token_ids) > 0
            assert not set(g.token_ids) & set(tiny_policy.suppress_ids)
    finally:
        hook.remove()


def test_sampling_is_deterministic_per_seed(tiny_policy: Policy) -> None:
    traj, _, _ = _start(tiny_policy)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    state = torch.random.get_rng_state()
    a = tiny_policy.generate([traj], params, seed=7)[0]
    b = tiny_policy.generate([traj], params, seed=7)[0]
    c = tiny_policy.generate([traj], params, seed=8)[0]
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids
    assert all(lp <= 0 for lp in a.logprobs)


def test_sampling_logprobs_match_recomputed_batched_multiturn(tiny_policy: Policy) -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=10)
    trajs = _rollout(tiny_policy, params, turns=2, seeds=[1, 2, 3])
    batch = tiny_policy.collate(trajs)
    lp = policy_logprobs(tiny_policy, batch, params)
    assert lp.requires_grad
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) == sum(t.num_generated for t in trajs) > 0
    diff = (lp.detach() - batch.old_logprobs)[mask].abs().max()
    assert float(diff) < 1e-4
    assert torch.isfinite(lp).all()
    (-(lp * batch.loss_mask).sum()).backward()  # pyright: ignore[reportUnknownMemberType]


def test_entropy_matches_the_sampling_distribution(tiny_policy: Policy) -> None:
    params = SamplingParams(temperature=0.7, max_new_tokens=6)
    trajs = _rollout(tiny_policy, params, turns=1, seeds=[1, 2])
    batch = tiny_policy.collate(trajs)
    with torch.no_grad():
        lp, ent = policy_logprobs_and_entropy(tiny_policy, batch, params)
        logits = tiny_policy.model(**batch.model_inputs(), use_cache=False).logits[:, :-1] / 0.7
    assert ent is not None and ent.shape == lp.shape
    assert torch.equal(lp, policy_logprobs(tiny_policy, batch, params))
    # Direct entropy of softmax over the ids the policy may emit, at one sampled position.
    row, col = [int(i) for i in batch.loss_mask.nonzero()[0]]
    allowed = torch.ones(logits.shape[-1], dtype=torch.bool)
    allowed[tiny_policy.suppress_ids] = False
    p = torch.softmax(logits[row, col - 1][allowed], dim=-1)
    expected = float(-(p * p.log()).sum())
    assert abs(float(ent[row, col]) - expected) < 1e-4
    n_allowed = int(allowed.sum())
    assert 0 < float(ent[batch.loss_mask.bool()].max()) <= float(torch.log(torch.tensor(n_allowed)))


def test_greedy_batch_equals_single(tiny_policy: Policy) -> None:
    trajs = [_start(tiny_policy, "5x5", 1)[0], _start(tiny_policy, "7x7", 2)[0]]
    params = SamplingParams(greedy=True, max_new_tokens=8)
    both = tiny_policy.generate(trajs, params)
    for t, g in zip(trajs, both, strict=True):
        (single,) = tiny_policy.generate([t], params)
        assert single.token_ids == g.token_ids


def test_lora_wrapped_policy_excludes_vision_and_matches_logprobs(tiny_policy: Policy) -> None:
    peft_model = apply_lora(tiny_policy.model, lora_config(rank=4, alpha=8))
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n and "language_model" in n for n in names)
    # Non-zero adapters, so the check covers the LoRA path, not just the base weights.
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    policy = Policy(peft_model, tiny_policy.processor)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    trajs = _rollout(policy, params, turns=2, seeds=[4, 5])
    batch = policy.collate(trajs)
    lp = policy_logprobs(policy, batch, params)
    mask = batch.loss_mask.bool()
    assert float((lp.detach() - batch.old_logprobs)[mask].abs().max()) < 1e-4
    loss = -(lp * batch.loss_mask).sum()
    loss.backward()  # pyright: ignore[reportUnknownMemberType]
    grads = [p.grad for n, p in peft_model.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and float(g.abs().sum()) > 0 for g in grads)


def test_rollouts_with_inline_frames_equal_data_uri_rollouts(tiny_policy: Policy) -> None:
    from maze_env import MazeSpec
    from maze_env.export import build_rows
    from maze_policy.rollout import run_episodes
    from maze_policy.sampling import SamplingParams

    rows = build_rows(MazeSpec.parse("easy"), [3, 4], split="train")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    fast = run_episodes(tiny_policy, rows, sampling=sampling, seed=11, max_turns=3)
    plain = run_episodes(
        tiny_policy,
        rows,
        sampling=sampling,
        seed=11,
        max_turns=3,
        env_config={"inline_images": False},
    )
    for a, b in zip(fast, plain, strict=True):
        assert a.replies == b.replies and a.turns == b.turns and a.reward == b.reward
        assert a.trajectory.input_ids == b.trajectory.input_ids
        assert a.trajectory.logprobs == b.trajectory.logprobs
        assert len(a.trajectory.pixel_values) == a.turns  # prompt + one frame per later turn
        for x, y in zip(a.trajectory.pixel_values, b.trajectory.pixel_values, strict=True):
            assert torch.equal(x, y)


def test_rollouts_keeping_the_cache_equal_rollouts_rereading_every_turn(
    tiny_policy: Policy,
) -> None:
    from maze_env import MazeSpec
    from maze_env.export import build_rows
    from maze_policy.rollout import run_episodes

    peft_model = apply_lora(tiny_policy.model, lora_config(rank=4, alpha=8))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    policy = Policy(peft_model, tiny_policy.processor)
    rows = build_rows(MazeSpec.parse("7x7"), [3, 4, 5, 6, 3, 3], split="train", slack=2)
    greedy = SamplingParams(greedy=True, max_new_tokens=6)
    kept = run_episodes(policy, rows, sampling=greedy, seed=1, max_turns=5)
    reread = run_episodes(policy, rows, sampling=greedy, seed=1, max_turns=5, keep_cache=False)
    for a, b in zip(kept, reread, strict=True):
        assert a.replies == b.replies and a.turns == b.turns
        assert a.trajectory.input_ids == b.trajectory.input_ids
        assert (
            max(
                abs(x - y)
                for x, y in zip(a.trajectory.logprobs, b.trajectory.logprobs, strict=True)
            )
            < 1e-4
        )
    # Sampled, with episodes ending at different turns (rows leave the cache as they end):
    # the recorded log-probs are the policy's, as the learner recomputes them.
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=6)
    budgets = [  # slack 0: 5x5 episodes end after 5 turns, 7x7 ones after 9 or more
        *build_rows(MazeSpec.parse("5x5"), [1, 2], split="train", slack=0),
        *build_rows(MazeSpec.parse("7x7"), [3, 4], split="train", slack=0),
    ]
    eps = run_episodes(policy, budgets, sampling=params, seed=2)
    assert len({e.turns for e in eps}) > 1
    again = run_episodes(policy, budgets, sampling=params, seed=2)
    assert [e.replies for e in eps] == [e.replies for e in again]  # seeded
    batch = policy.collate([e.trajectory for e in eps])
    with torch.no_grad():
        lp = policy_logprobs(policy, batch, params)
    mask = batch.loss_mask.bool()
    assert float((lp - batch.old_logprobs)[mask].abs().max()) < 1e-4


def test_latest_context_answers_each_turn_from_the_system_prompt_and_its_own_frame(
    tiny_policy: Policy,
) -> None:
    import pytest

    from maze_env import MazeSpec
    from maze_env.export import build_rows
    from maze_policy.rollout import OPENING_STATE, run_episodes

    rows = build_rows(MazeSpec.parse("5x5"), [1, 2, 3], split="train", slack=0)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    eps = run_episodes(tiny_policy, rows, sampling=params, seed=4, context="latest")
    enc = tiny_policy.encoder
    for row, ep in zip(rows, eps, strict=True):
        assert ep.turns >= 1 and len(ep.turn_trajectories) == ep.turns
        assert ep.sequences == ep.turn_trajectories and not ep.trajectory.input_ids
        system = [m for m in row["prompt"] if m["role"] == "system"]
        opening = enc.start(row["prompt"])
        for turn, seq in enumerate(ep.turn_trajectories):
            # One frame and one reply per sequence; every prompt opens with the system prompt.
            assert len(seq.pixel_values) == 1 and len(seq.generated_spans()) == 1
            head = enc.start([*system, {"role": "user", "content": "x"}]).input_ids
            prefix = next(
                i for i, (a, b) in enumerate(zip(head, seq.input_ids, strict=False)) if a != b
            )
            assert prefix > 0 and seq.input_ids[:prefix] == head[:prefix]
            if turn == 0:
                assert seq.input_ids[: len(opening)] == opening.input_ids
            else:  # the feedback turn, not the task text
                prompt = seq.input_ids[: seq.generated_spans()[0][0]]
                text = str(enc.tokenizer.decode(prompt))
                assert "Turns left" in text and "Here is a" not in text
    # Each turn's state is what it was answered from: the opening, then the square each reply
    # left the agent on and that reply's outcome (replayed on the game).
    for row, ep in zip(rows, eps, strict=True):
        maze = generate("5x5", int(row["seed"]))
        game = MazeGame.start(maze, step_budget=int(row["step_budget"]))
        states = [OPENING_STATE]
        for reply in ep.replies[:-1]:
            outcome = game.step(cast(Any, parse_action(reply))).outcome
            states.append("{},{}:{}".format(*game.agent, outcome))
        assert ep.states == states
    # The recorded log-probs are the ones the learner recomputes on the turn sequences.
    batch = tiny_policy.collate([s for e in eps for s in e.sequences])
    with torch.no_grad():
        lp = policy_logprobs(tiny_policy, batch, params)
    mask = batch.loss_mask.bool()
    assert float((lp - batch.old_logprobs)[mask].abs().max()) < 1e-4
    # The same seed plays the same episodes; an unknown context is refused.
    again = run_episodes(tiny_policy, rows, sampling=params, seed=4, context="latest")
    assert [e.replies for e in eps] == [e.replies for e in again]
    with pytest.raises(ValueError, match="context must be one of full, latest, recent"):
        run_episodes(tiny_policy, rows, sampling=params, seed=4, context="window")


def test_recent_context_puts_the_previous_reply_before_the_feedback(tiny_policy: Policy) -> None:
    from maze_env import MazeSpec
    from maze_env.export import build_rows
    from maze_policy.rollout import run_episodes

    rows = build_rows(MazeSpec.parse("5x5"), [1, 2], split="train", slack=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    eps = run_episodes(tiny_policy, rows, sampling=params, seed=5, context="recent")
    tok = tiny_policy.encoder.tokenizer
    later = 0
    for ep in eps:
        assert len(ep.turn_trajectories) == ep.turns and len(ep.states) == ep.turns
        for turn, seq in enumerate(ep.turn_trajectories[1:], start=1):
            assert len(seq.pixel_values) == 1 and len(seq.generated_spans()) == 1
            prompt = " ".join(str(tok.decode(seq.input_ids[: seq.generated_spans()[0][0]])).split())
            said = " ".join(ep.replies[turn - 1].split())
            assert "Turns left" in prompt and "Here is a" not in prompt
            if said:  # a reply of special tokens only decodes to nothing
                assert prompt.rindex(said) < prompt.index("Turns left")
                later += 1
    assert later > 0
    batch = tiny_policy.collate([s for e in eps for s in e.sequences])
    with torch.no_grad():
        lp = policy_logprobs(tiny_policy, batch, params)
    mask = batch.loss_mask.bool()
    assert float((lp - batch.old_logprobs)[mask].abs().max()) < 1e-4


def test_route_context_asks_the_route_question_of_each_frame_alone(tiny_policy: Policy) -> None:
    import pytest

    from maze_env import MazeSpec
    from maze_env.export import build_rows
    from maze_policy.contexts import ROUTE_QUESTION
    from maze_policy.errors import ChatEncodingError
    from maze_policy.rollout import in_context, route_turn, run_episodes

    rows = build_rows(MazeSpec.parse("5x5"), [1, 2], split="train", slack=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    eps = run_episodes(tiny_policy, rows, sampling=params, seed=7, context="route")
    enc = tiny_policy.encoder
    # What the route base was pretrained on: one frame, then the question, nothing else.
    frame = {
        "type": "image_url",
        "image_url": {"url": rows[0]["prompt"][1]["content"][0]["image_url"]["url"]},
    }
    asked = [{"role": "user", "content": [frame, {"type": "text", "text": ROUTE_QUESTION}]}]
    assert route_turn(rows[0]["prompt"]) == asked
    turns = 0
    for ep in eps:
        assert len(ep.turn_trajectories) == ep.turns and len(ep.states) == ep.turns
        for seq in ep.turn_trajectories:
            assert len(seq.pixel_values) == 1 and len(seq.generated_spans()) == 1
            prompt = str(enc.tokenizer.decode(seq.input_ids[: seq.generated_spans()[0][0]]))
            assert ROUTE_QUESTION in prompt
            assert "Turns left" not in prompt and "Here is a" not in prompt
            assert "maze" not in prompt.replace(ROUTE_QUESTION, "")  # no system prompt either
            turns += 1
    assert turns > len(rows)
    assert (
        enc.start(asked).input_ids == eps[0].turn_trajectories[0].input_ids[: len(enc.start(asked))]
    )
    batch = tiny_policy.collate([s for e in eps for s in e.sequences])
    with torch.no_grad():
        lp = policy_logprobs(tiny_policy, batch, params)
    mask = batch.loss_mask.bool()
    assert float((lp - batch.old_logprobs)[mask].abs().max()) < 1e-4
    # A conversation whose last user turn has no frame cannot be asked the question.
    text_only = [{"role": "user", "content": [{"type": "text", "text": "which way?"}]}]
    with pytest.raises(ChatEncodingError, match="context 'route' answers the frame"):
        in_context(text_only, "route")
    with pytest.raises(ChatEncodingError, match="has none"):
        route_turn([{"role": "system", "content": "s"}])


def test_turn_messages_per_context_and_route_keeps_every_frame_the_encoder_reads() -> None:
    import pytest
    from PIL import Image

    from maze_policy.chat import message_images
    from maze_policy.contexts import ROUTE_QUESTION
    from maze_policy.rollout import route_turn, turn_messages

    img = Image.new("RGB", (4, 4), "red")
    system = {"role": "system", "content": "s"}
    opening = [
        system,
        {
            "role": "user",
            "content": [{"type": "image", "image": img}, {"type": "text", "text": "t"}],
        },
    ]
    # A frame part without a "type" key: the encoder shows it, so route must keep it.
    later = [{"role": "user", "content": [{"image": img}, {"type": "text", "text": "bumped"}]}]
    assert len(message_images(later[0])) == 1
    (asked,) = turn_messages("route", opening, later, "right")
    assert asked["content"] == [{"image": img}, {"type": "text", "text": ROUTE_QUESTION}]
    assert turn_messages("route", opening) == route_turn(opening)
    assert turn_messages("latest", opening) == opening == turn_messages("full", opening)
    assert turn_messages("latest", opening, later, "right") == [system, *later]
    reply = {"role": "assistant", "content": "right"}
    assert turn_messages("recent", opening, later, "right") == [system, reply, *later]
    assert turn_messages("route-recent", opening, later, "right") == [reply, asked]
    assert turn_messages("route-recent", opening) == route_turn(opening)
    with pytest.raises(ValueError, match="no turn of its own"):
        turn_messages("full", opening, later)
    with pytest.raises(ValueError, match="context must be one of"):
        turn_messages("nearest", opening)


def test_whole_conversations_cut_to_a_context_are_the_turns_rollouts_answer_in(
    tiny_policy: Policy,
) -> None:
    """A client or server holding the whole conversation sends what training answered from."""
    import pytest

    from maze_env import MazeSpec
    from maze_env.export import build_rows
    from maze_policy.rollout import in_context, make_env, run_episodes

    rows = build_rows(MazeSpec.parse("5x5"), [1, 2], split="train", slack=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    enc = tiny_policy.encoder
    checked = 0
    for context in ("latest", "recent", "route", "route-recent"):
        eps = run_episodes(tiny_policy, rows, sampling=params, seed=6, context=context)
        for row, ep in zip(rows, eps, strict=True):
            # Replay the episode's replies on a fresh env, keeping the whole conversation.
            env = make_env(row, {"inline_images": True})
            conversation: list[Any] = list(env.init(row["prompt"])[0])
            prompts: list[list[int]] = []
            for reply in ep.replies:
                prompts.append(enc.start(in_context(conversation, context)).input_ids)
                out = env.step(reply)
                conversation += [{"role": "assistant", "content": reply}, *out["observations"]]
            answered = [s.input_ids[: s.generated_spans()[0][0]] for s in ep.turn_trajectories]
            assert prompts == answered
            assert in_context(conversation, "full") == conversation
            checked += len(prompts)
    assert checked > 6
    # A conversation with no reply yet is an opening, kept whole; an unknown context is refused.
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert in_context(opening, "latest") == opening
    # ``route-recent`` before any reply is ``route``'s opening: nothing came before the frame.
    framed = [
        *opening[:1],
        {"role": "user", "content": [{"image": 1}, {"type": "text", "text": "u"}]},
    ]
    assert in_context(framed, "route-recent") == in_context(framed, "route")
    with pytest.raises(ValueError, match="context must be one of full, latest, recent"):
        in_context(opening, "window")


def test_an_adapter_directory_records_its_context(tmp_path: Path) -> None:
    from maze_policy.contexts import CONTEXT_FILE, read_context, write_context
    from maze_policy.errors import ContextRecordError

    assert read_context(tmp_path) is None  # nothing recorded: callers fall back to full
    assert write_context(tmp_path, "route-recent") == tmp_path / CONTEXT_FILE
    assert read_context(tmp_path) == "route-recent"
    with pytest.raises(ValueError, match="context must be one of"):
        write_context(tmp_path, "window")
    assert read_context(tmp_path) == "route-recent"  # a refused write leaves the record alone
    for text in ("not json", "[]", '{"context": "window"}', '{"ctx": "route"}'):
        (tmp_path / CONTEXT_FILE).write_text(text)
        with pytest.raises(ContextRecordError, match=f"{CONTEXT_FILE}: not a context record"):
            read_context(tmp_path)


def test_the_context_chosen_from_an_explicit_choice_and_the_records() -> None:
    from maze_policy.contexts import ContextChoice, choose_context

    assert choose_context(None, {}) == ContextChoice("full", "default")
    assert choose_context(None, {"a": "route", "b": "route"}) == ContextChoice("route", "recorded")
    assert choose_context("latest", {"a": "route", "b": "latest"}) == ContextChoice(
        "latest", "explicit", {"a": "route"}
    )
    # Records that disagree need an explicit choice, which then names the ones it overrides.
    with pytest.raises(ValueError, match=r"different contexts \(a: full, b: route\)"):
        choose_context(None, {"b": "route", "a": "full"})
    assert choose_context("route", {"b": "route", "a": "full"}).differing == {"a": "full"}
    with pytest.raises(ValueError, match="context must be one of"):
        choose_context("window", {})
