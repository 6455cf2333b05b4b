"""Hand-written recurrent models as users write them, for bench/beyond_zoo.py: a padded
batch packed by its lengths, a GRUCell loop, an LSTM encoder-decoder with attention, a
stateful RNN that keeps its hidden state between calls (truncated BPTT), and a Conv1d,
BatchNorm and batch-first GRU stack."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True, bidirectional=True, dropout=0.1)
        self.head = nn.Linear(128, 5)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True)
        return self.head(out.mean(1))


def packed() -> nn.Module:
    return Packed()


def packed_inputs() -> tuple[tuple, dict]:
    return (torch.randint(0, 100, (4, 12)), torch.tensor([12, 9, 5, 3])), {}


class CellLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(16, 32)
        self.out = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, B, 16]
        h = x.new_zeros(x.shape[1], 32)
        outs = []
        for t in range(x.shape[0]):
            h = self.cell(x[t], h)
            outs.append(self.out(h))
        return torch.stack(outs)


def cell_loop() -> nn.Module:
    return CellLoop()


def cell_loop_inputs() -> tuple[tuple, dict]:
    return (torch.randn(10, 4, 16),), {}


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.src = nn.Embedding(50, 24)
        self.tgt = nn.Embedding(50, 24)
        self.enc = nn.LSTM(24, 48, batch_first=True)
        self.dec = nn.LSTM(24 + 48, 48, batch_first=True)
        self.attn = nn.Linear(48, 48, bias=False)
        self.proj = nn.Linear(96, 50)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        enc, (h, c) = self.enc(self.src(src))
        y = self.tgt(tgt)
        ctx = enc.mean(1, keepdim=True).expand(-1, y.shape[1], -1)
        dec, _ = self.dec(torch.cat([y, ctx], -1), (h, c))
        scores = torch.bmm(self.attn(dec), enc.transpose(1, 2)).softmax(-1)
        mixed = torch.bmm(scores, enc)
        return self.proj(torch.cat([dec, mixed], -1))


def seq2seq() -> nn.Module:
    return Seq2Seq()


def seq2seq_inputs() -> tuple[tuple, dict]:
    return (torch.randint(0, 50, (3, 9)), torch.randint(0, 50, (3, 7))), {}


class Stateful(nn.Module):
    """Keeps its hidden state between calls, detached (truncated BPTT)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(8, 16, nonlinearity="tanh")
        self.fc = nn.Linear(16, 2)
        self.hidden = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, B, 8]
        out, h = self.rnn(x, self.hidden)
        self.hidden = h.detach()
        return self.fc(out[-1])


def stateful() -> nn.Module:
    return Stateful()


def stateful_inputs() -> tuple[tuple, dict]:
    return (torch.randn(6, 3, 8),), {}


class ConvGru(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 16, 3, padding=1)
        self.bn = nn.BatchNorm1d(16)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.ln = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, 4, T]
        h = torch.relu(self.bn(self.conv(x))).transpose(1, 2)
        out, _ = self.gru(h)
        return self.fc(self.ln(out[:, -1]))


def conv_gru() -> nn.Module:
    return ConvGru()


def conv_gru_inputs() -> tuple[tuple, dict]:
    return (torch.randn(8, 4, 20),), {}
