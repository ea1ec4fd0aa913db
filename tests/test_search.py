"""Greedy and beam search: exactness against exhaustive search on a table model, the length
penalty, per-sentence caps, finished sentences leaving the batch, beam 1 == greedy and batch
independence on the real models."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import Tensor

from nmt.config import ConfigError, GRUBahdanauConfig, TransformerConfig
from nmt.decode.options import DecodeOptions
from nmt.decode.search import beam_search, clip_sources, greedy_search, max_output_lengths, search
from nmt.models.base import DecoderState, Seq2Seq, lengths_to_mask
from nmt.models.registry import create_model

PAD, BOS, EOS = 0, 2, 3


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------ a table model


class TableModel(Seq2Seq):
    """Next-token logits are a fixed function of (sentence id, target prefix).

    The sentence id is the first source token, kept once per sentence in the state (every
    hypothesis row reads its sentence's through the state's group size). Sentence 0 takes its
    logits from ``fixed`` when the prefix is listed there; everything else comes from a random
    generator seeded by the id and the prefix. Every call to ``decode_step`` records its number
    of rows in ``rows``.
    """

    def __init__(self, vocab: int = 5, seed: int = 0, fixed: dict | None = None) -> None:
        super().__init__()
        self.vocab, self.seed, self.pad_id = vocab, seed, PAD
        self.fixed = {k: torch.tensor(v, dtype=torch.float) for k, v in (fixed or {}).items()}
        self.rows: list[int] = []
        self._cache: dict[tuple[int, ...], Tensor] = {}

    def logits(self, sid: int, prefix: tuple[int, ...]) -> Tensor:
        """(V,) logits after ``prefix`` (tokens without BOS) for sentence ``sid``."""
        if sid == 0 and prefix in self.fixed:
            return self.fixed[prefix]
        key = (self.seed, sid, *prefix)
        if key not in self._cache:
            gen = torch.Generator().manual_seed(hash(key) & 0x7FFFFFFF)
            self._cache[key] = 2.0 * torch.randn(self.vocab, generator=gen)  # (V,)
        return self._cache[key]

    def logp(self, sid: int, prefix: tuple[int, ...]) -> Tensor:
        return torch.log_softmax(self.logits(sid, prefix), dim=-1)  # (V,)

    def encode(self, src: Tensor, src_lens: Tensor) -> DecoderState:
        empty = torch.zeros(src.size(0), 0, dtype=torch.long)  # (B, 0)
        return DecoderState({"prefix": empty}, {"sid": src[:, 0].clone()})

    def decode_step(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState, None]:
        self.rows.append(tokens.size(0))
        prefix = torch.cat([state.rows["prefix"], tokens[:, None]], dim=1)  # (N, t + 1), BOS 1st
        sids = state.sentences["sid"].repeat_interleave(state.group)  # (N,)
        assert sids.size(0) == tokens.size(0)
        rows = zip(sids.tolist(), prefix[:, 1:].tolist(), strict=True)
        logits = torch.stack([self.logits(s, tuple(p)) for s, p in rows])  # (N, V)
        return logits, state.next({"prefix": prefix}), None


def table_batch(sids: list[int]) -> tuple[Tensor, Tensor]:
    """A source batch naming sentence ids: src (B, 2), src_lens (B,)."""
    src = torch.tensor([[s, EOS] for s in sids])  # (B, 2)
    return src, torch.full((len(sids),), 2)


def exhaustive(
    model: TableModel, sid: int, cap: int, alpha: float
) -> list[tuple[float, tuple[int, ...]]]:
    """Every output of at most ``cap`` tokens with its length-penalised score, best first."""
    words = [t for t in range(model.vocab) if t != EOS]
    scored = []
    for n in range(cap + 1):
        for seq in itertools.product(words, repeat=n):
            raw = sum(float(model.logp(sid, seq[:i])[tok]) for i, tok in enumerate(seq))
            raw += float(model.logp(sid, seq)[EOS])
            scored.append((raw / ((5 + n + 1) / 6) ** alpha, seq))
    return sorted(scored, reverse=True)


# ------------------------------------------------------------------ exactness and scoring


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.5])
def test_wide_beam_finds_the_exhaustive_optimum(alpha: float) -> None:
    model = TableModel(vocab=5, seed=int(alpha * 10))
    sids, caps = [0, 1, 2, 3, 4, 5], torch.tensor([1, 2, 3, 3, 2, 3])
    src, src_lens = table_batch(sids)
    beam = 4**3  # every prefix of up to 3 tokens over the 4 non-EOS tokens: no pruning
    hyps = beam_search(model, src, src_lens, caps, BOS, EOS, beam, alpha)
    for sid, cap, hyp in zip(sids, caps.tolist(), hyps, strict=True):
        best_score, best_seq = exhaustive(model, sid, cap, alpha)[0]
        assert tuple(hyp.tokens) == best_seq
        assert hyp.score == pytest.approx(best_score, abs=1e-5)
        assert len(hyp.tokens) <= cap


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_narrow_beam_scores_are_consistent(alpha: float) -> None:
    model = TableModel(vocab=5, seed=7)
    src, src_lens = table_batch([0, 1, 2, 3])
    caps = torch.tensor([4, 4, 3, 4])
    hyps = beam_search(model, src, src_lens, caps, BOS, EOS, 3, alpha)
    for sid, cap, hyp in zip(range(4), caps.tolist(), hyps, strict=True):
        table = {seq: score for score, seq in exhaustive(model, sid, cap, alpha)}
        assert 1 <= len(hyp.nbest) <= 3
        assert hyp.nbest[0] == (hyp.tokens, hyp.score)
        scores = [s for _, s in hyp.nbest]
        assert scores == sorted(scores, reverse=True)
        for tokens, score in hyp.nbest:
            assert score == pytest.approx(table[tuple(tokens)], abs=1e-5)
        assert hyp.score <= max(table.values()) + 1e-6


def logits_for(probs: dict[int, float], vocab: int = 5) -> list[float]:
    """Logits whose softmax gives ``probs`` (the rest of the mass spread over the others)."""
    rest = [t for t in range(vocab) if t not in probs]
    left = (1.0 - sum(probs.values())) / len(rest)
    return [math.log(probs.get(t, left)) for t in range(vocab)]


def test_length_penalty_prefers_the_longer_output() -> None:
    # EOS at once: log 0.5 = -0.69. Token 4 then EOS: log 0.4 + log 0.9 = -1.02.
    fixed = {(): logits_for({EOS: 0.5, 4: 0.4}), (4,): logits_for({EOS: 0.9})}
    model = TableModel(vocab=5, fixed=fixed)
    src, src_lens = table_batch([0])
    caps = torch.tensor([3])
    short = beam_search(model, src, src_lens, caps, BOS, EOS, beam=2, alpha=0.0)[0]
    assert short.tokens == [] and short.score == pytest.approx(math.log(0.5), abs=1e-5)
    # alpha = 2: -0.69 / 1 versus -1.02 / (7/6)^2 = -0.75: still the empty output
    assert beam_search(model, src, src_lens, caps, BOS, EOS, 2, alpha=2.0)[0].tokens == []
    # alpha = 4: -1.02 / (7/6)^4 = -0.55 beats -0.69
    long = beam_search(model, src, src_lens, caps, BOS, EOS, beam=2, alpha=4.0)[0]
    assert long.tokens == [4]
    assert long.score == pytest.approx(math.log(0.4 * 0.9) / (7 / 6) ** 4, abs=1e-5)
    assert [t for t, _ in long.nbest] == [[4], []]


def test_search_does_not_stop_while_a_longer_output_can_win() -> None:
    # after EOS at once (-0.69) and a 1-token output (-2.3 raw), the beam is full, but the
    # alive prefix (4,) (-0.92 raw) can still win under alpha = 4: it must be followed.
    fixed = {
        (): logits_for({EOS: 0.5, 4: 0.4, 1: 0.05}),
        (1,): logits_for({EOS: 0.9}),
        (4,): logits_for({4: 0.9, EOS: 0.05}),
        (4, 4): logits_for({EOS: 0.95}),
    }
    model = TableModel(vocab=5, fixed=fixed)
    src, src_lens = table_batch([0])
    hyp = beam_search(model, src, src_lens, torch.tensor([3]), BOS, EOS, beam=2, alpha=4.0)[0]
    expected = math.log(0.4 * 0.9 * 0.95) / (8 / 6) ** 4
    assert hyp.tokens == [4, 4] and hyp.score == pytest.approx(expected, abs=1e-5)


def test_output_cap_is_per_sentence_and_closes_with_eos() -> None:
    never_eos = logits_for({4: 0.9, EOS: 0.01})
    model = TableModel(vocab=5, fixed={p: never_eos for p in [(), (4,), (4, 4), (4, 4, 4)]})
    src, src_lens = table_batch([0, 0])
    caps = torch.tensor([1, 3])
    a, b = greedy_search(model, src, src_lens, caps, BOS, EOS)
    assert a.tokens == [4] and b.tokens == [4, 4, 4]
    # the EOS that closes an output at its cap is scored like any other token
    assert b.score == pytest.approx(3 * math.log(0.9) + math.log(0.01), abs=1e-5)
    for beam in (2, 5):
        hyps = beam_search(model, src, src_lens, caps, BOS, EOS, beam, 1.0)
        for hyp, cap in zip(hyps, caps.tolist(), strict=True):
            assert all(len(tokens) <= cap for tokens, _ in hyp.nbest)


def test_minimum_length_holds_back_eos_until_it_or_the_cap() -> None:
    eos_now = logits_for({EOS: 0.99})
    model = TableModel(vocab=5, fixed={(): eos_now, (4,): eos_now, (4, 4): eos_now})
    src, src_lens = table_batch([0, 0, 1])
    caps = torch.tensor([6, 2, 6])
    greedy = greedy_search(model, src, src_lens, caps, BOS, EOS, min_len=4)
    lengths = [len(h.tokens) for h in greedy]
    assert lengths[:2] == [4, 2] and 4 <= lengths[2] <= 6  # EOS once allowed; cap 2 wins
    for beam in (1, 3):
        hyps = beam_search(model, src, src_lens, caps, BOS, EOS, beam, 1.0, min_len=4)
        for hyp, cap in zip(hyps, caps.tolist(), strict=True):
            assert all(min(4, cap) <= len(tokens) <= cap for tokens, _ in hyp.nbest)
    fixed_len = beam_search(model, src, src_lens, torch.tensor([5, 5, 5]), BOS, EOS, 3, 1.0,
                            min_len=5)  # fmt: skip
    assert all(len(t) == 5 for h in fixed_len for t, _ in h.nbest)  # min = cap: equal work


def test_finished_sentences_leave_the_batch() -> None:
    # sentence 0: two likely first tokens, each followed by EOS almost surely;
    # sentence 1: random, never more than 4 tokens
    eos_now = logits_for({EOS: 0.99})
    fixed = {(): logits_for({4: 0.6, 1: 0.3, EOS: 0.01}), (1,): eos_now, (4,): eos_now}
    model = TableModel(vocab=5, seed=3, fixed=fixed)
    src, src_lens = table_batch([0, 1])
    beam = 2
    hyps = beam_search(model, src, src_lens, torch.tensor([4, 4]), BOS, EOS, beam, 0.0)
    assert [t for t, _ in hyps[0].nbest] == [[4], [1]]
    # step 0: 2 sources; step 1: 2 sentences x beam; then sentence 0 has left the batch
    assert model.rows[:2] == [2, 2 * beam]
    assert model.rows[2:] and all(r == beam for r in model.rows[2:])
    assert len(model.rows) <= 5


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_one_is_greedy_on_the_table_model(alpha: float) -> None:
    model = TableModel(vocab=6, seed=11)
    src, src_lens = table_batch(list(range(8)))
    caps = torch.tensor([1, 2, 3, 4, 5, 6, 3, 2])
    greedy = greedy_search(model, src, src_lens, caps, BOS, EOS)
    beam = beam_search(model, src, src_lens, caps, BOS, EOS, 1, alpha)
    assert [(h.tokens, h.score, h.nbest) for h in beam] == [
        (h.tokens, h.score, h.nbest) for h in greedy
    ]


# ------------------------------------------------------------------------- real models

SRC_V, TGT_V = 13, 11
TINY = {
    "gru": (
        GRUBahdanauConfig,
        dict(emb_dim=8, hidden_dim=12, enc_layers=2, dec_layers=2, attn_dim=10),
    ),
    "transformer": (
        TransformerConfig,
        dict(d_model=16, heads=2, d_ff=32, enc_layers=2, dec_layers=2, max_positions=64),
    ),
}


def real_model(name: str, seed: int = 0) -> Seq2Seq:
    """A tiny model with random weights whose EOS logit is raised so lengths vary."""
    schema, sizes = TINY[name]
    torch.manual_seed(seed)
    cfg = OmegaConf.structured(schema(**sizes))
    model = create_model(cfg, src_vocab_size=SRC_V, tgt_vocab_size=TGT_V, pad_id=PAD)
    with torch.no_grad():
        model.out_proj.weight.mul_(4.0)
        model.out_proj.weight[EOS] *= 0.5
    return model.eval()


def random_sources(lens: list[int], seed: int = 0) -> tuple[Tensor, Tensor]:
    """src (B, S) right-padded, each row ending in EOS; src_lens (B,)."""
    gen = torch.Generator().manual_seed(seed)
    src_lens = torch.tensor(lens)
    src = torch.randint(4, SRC_V, (len(lens), max(lens)), generator=gen)  # (B, S)
    src[torch.arange(len(lens)), src_lens - 1] = EOS
    return src.masked_fill(~lengths_to_mask(src_lens), PAD), src_lens


@pytest.mark.parametrize("name", sorted(TINY))
def test_beam_one_is_greedy_on_real_models(name: str) -> None:
    model = real_model(name)
    src, src_lens = random_sources([3, 9, 5, 1, 7, 2])
    caps = torch.tensor([4, 12, 8, 2, 10, 3])
    greedy = greedy_search(model, src, src_lens, caps, BOS, EOS, keep_attention=True)
    beam = beam_search(model, src, src_lens, caps, BOS, EOS, 1, 1.0, keep_attention=True)
    for g, b in zip(greedy, beam, strict=True):
        assert b.tokens == g.tokens and b.score == g.score
        assert torch.equal(b.attention, g.attention)
    assert len({len(g.tokens) for g in greedy}) > 1  # the outputs differ in length


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("name", sorted(TINY))
def test_a_sentence_decodes_the_same_alone_and_in_a_batch(name: str, beam: int) -> None:
    model = real_model(name, seed=1)
    lens = [6, 2, 11, 4, 8]
    src, src_lens = random_sources(lens, seed=2)
    opts = DecodeOptions(beam=beam, length_penalty=1.0, max_output_len_a=1.0, max_output_len_b=3)
    together = search(model, src, src_lens, opts, keep_attention=True)
    smaller = search(model, src[1:4, :11], src_lens[1:4], opts)  # other mates, less padding
    for i, n in enumerate(lens):
        alone = search(model, src[i : i + 1, :n], src_lens[i : i + 1], opts, True)[0]
        assert together[i].tokens == alone.tokens
        assert together[i].score == pytest.approx(alone.score, abs=1e-4)
        assert [t for t, _ in together[i].nbest] == [t for t, _ in alone.nbest]
        assert together[i].attention.shape == alone.attention.shape == (len(alone.tokens) + 1, n)
        torch.testing.assert_close(together[i].attention, alone.attention, atol=1e-4, rtol=0)
        if 1 <= i < 4:
            assert smaller[i - 1].tokens == alone.tokens


def test_beam_search_attention_rows_sum_to_one() -> None:
    model = real_model("gru", seed=3)
    src, src_lens = random_sources([5, 3], seed=4)
    hyps = beam_search(model, src, src_lens, torch.tensor([6, 6]), BOS, EOS, 3, 0.6, True)
    for hyp, n in zip(hyps, [5, 3], strict=True):
        assert hyp.attention.shape == (len(hyp.tokens) + 1, n)
        torch.testing.assert_close(hyp.attention.sum(-1), torch.ones(len(hyp.tokens) + 1))


def test_long_source_is_cut_to_the_position_table() -> None:
    model = real_model("transformer")
    assert model.max_positions == 64
    assert real_model("gru").max_positions is None
    src, src_lens = random_sources([100, 5])
    cut, cut_lens = clip_sources(src, src_lens, 64)
    assert cut.shape == (2, 64) and cut_lens.tolist() == [64, 5] and cut[0, -1] == EOS
    opts = DecodeOptions(beam=3, max_output_len_a=2.0, max_output_len_b=10)
    hyps = search(model, src, src_lens, opts)
    assert len(hyps[0].tokens) <= 63


# ------------------------------------------------------------------------ options and caps


def test_output_caps_are_a_times_length_plus_b_within_the_positions() -> None:
    opts = DecodeOptions(max_output_len_a=1.5, max_output_len_b=2)
    lens = list(range(0, 60))
    expected = [max(3 * n // 2 + 2, 1) for n in lens]  # exact: 1.5 n + 2, rounded down
    assert opts.caps(lens).tolist() == expected
    assert opts.caps(lens, max_positions=40).tolist() == [min(c, 39) for c in expected]
    assert DecodeOptions(max_output_len_a=0.0, max_output_len_b=0).caps([7]).tolist() == [1]
    # the default cap, 1.2 * length + 10, for every length a model can take
    default = DecodeOptions().caps(range(1025))
    assert default.tolist() == [(12 * n) // 10 + 10 for n in range(1025)]


def test_search_caps_keep_the_model_positions() -> None:
    opts = DecodeOptions(max_output_len_a=2.0, max_output_len_b=10)
    src_lens = torch.tensor([5, 40])
    transformer, gru = real_model("transformer"), real_model("gru")
    assert max_output_lengths(transformer, src_lens, opts).tolist() == [20, 63]
    assert max_output_lengths(gru, src_lens, opts).tolist() == [20, 90]


def test_options_unset_search_comes_from_the_run() -> None:
    command = OmegaConf.create(
        {"beam": None, "length_penalty": None, "max_output_len_a": 0.5, "max_output_len_b": 3,
         "min_output_len": 0, "max_tokens": 100, "precision": "32", "device": "cpu",
         "sampling_topk": 1, "sampling_topp": 1.0, "sampling_temperature": 1.0,
         "sampling_seed": 0}
    )  # fmt: skip
    assert (DecodeOptions.from_config(command).beam, DecodeOptions.of_run(None).beam) == (1, 1)
    run = OmegaConf.create({"beam": 4, "length_penalty": 0.6, "checkpoint": "best"})
    opts = DecodeOptions.from_config(command, run)
    assert (opts.beam, opts.length_penalty, opts.max_output_len_a, opts.max_tokens) == (
        4, 0.6, 0.5, 100,
    )  # fmt: skip
    command.beam = 2
    assert DecodeOptions.from_config(command, run).beam == 2  # the command's own wins
    bad_values = [
        ({"beam": 0}, "beam=0"),
        ({"max_output_len_b": -1}, "max_output_len_b=-1"),
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"max_tokens": 0}, "max_tokens=0"),
    ]
    for bad, message in bad_values:
        with pytest.raises(ConfigError, match=message):
            DecodeOptions(**bad)


def test_state_rows_must_be_group_hypotheses_per_sentence() -> None:
    model = TableModel()
    state = model.encode(*table_batch([0, 1, 2]))
    beams = state.select(torch.tensor([0, 0, 1, 1, 2, 2]), group=2)
    assert beams.group == 2 and beams.sentences["sid"] is state.sentences["sid"]  # not copied
    kept = beams.select(torch.tensor([0, 1, 4, 5]), sentences=torch.tensor([0, 2]))
    assert kept.group == 2 and kept.sentences["sid"].tolist() == [0, 2]
    with pytest.raises(ValueError, match="not 2 per sentence of 3"):
        state.select(torch.tensor([0, 0, 1, 1]), group=2)
    with pytest.raises(ValueError, match="not 1 per sentence of 3"):
        state.select(torch.tensor([0, 1]))
