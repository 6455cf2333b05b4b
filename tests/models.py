"""Test models the tests build themselves (no downloads). Shared by every test module.

Each `make_*` returns (model, example inputs as (args, kwargs)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# ResNet-18, the standard architecture (He et al. 2015; torchvision's layout and names).
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._stage(64, 64, 1)
        self.layer2 = self._stage(64, 128, 2)
        self.layer3 = self._stage(128, 256, 2)
        self.layer4 = self._stage(256, 512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    @staticmethod
    def _stage(inplanes: int, planes: int, stride: int) -> nn.Sequential:
        return nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ResNet-18 parameter count, the published figure (torchvision: 11,689,512).
RESNET18_PARAMS = 11_689_512


def make_resnet18(batch: int = 2, size: int = 64):
    return ResNet18(), ((torch.randn(batch, 3, size, size),), {})


def make_gpt2(batch: int = 2, seq: int = 16, **config):
    """GPT-2 small from its config (random init, no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**config)).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    return model, ((), {"input_ids": ids})


# GPT-2 small: 124,439,808 parameters with the LM head tied to the token embedding.
GPT2_PARAMS = 124_439_808


def make_bert(batch: int = 2, seq: int = 16, **config):
    """BERT-base from its config (random init, no download)."""
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(**config)).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    return model, ((), {"input_ids": ids})


class DataDependent(nn.Module):
    """fx cannot trace `if x.sum() > 0` (a Proxy has no truth value)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:  # data-dependent control flow
            h = torch.relu(h)
        return self.b(h)


def make_data_dependent(batch: int = 4):
    return DataDependent(), ((torch.randn(batch, 8),), {})


class DictInTupleOut(nn.Module):
    """Takes a dict of inputs, returns a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(16, 8)
        self.text = nn.Embedding(100, 8)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.image(batch["image"])
        txt = self.text(batch["tokens"]).mean(dim=1)
        return img + txt, img * txt


def make_dict_in_tuple_out(batch: int = 4):
    inputs = {"image": torch.randn(batch, 16), "tokens": torch.randint(0, 100, (batch, 5))}
    return DictInTupleOut(), ((inputs,), {})


class EmbeddingBag(nn.Module):
    """Integer token ids in, a pooled vector out."""

    def __init__(self, vocab: int = 1000, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(ids).mean(dim=1))


def make_embedding(batch: int = 4, seq: int = 12):
    return EmbeddingBag(), ((torch.randint(0, 1000, (batch, seq)),), {})


class TiedLM(nn.Module):
    """A tiny language model whose output projection shares the embedding's weight."""

    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.emb(ids))))


def make_tied(batch: int = 2, seq: int = 6):
    return TiedLM(), ((torch.randint(0, 50, (batch, seq)),), {})


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (784, 512, 256, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_mlp(batch: int = 32):
    return MLP(), ((torch.randn(batch, 784),), {})


class SmallCNN(nn.Module):
    """Conv + BatchNorm + Dropout: mode-dependent modules."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(F.relu(self.features(x).flatten(1))))


def make_small_cnn(batch: int = 8):
    return SmallCNN(), ((torch.randn(batch, 3, 32, 32),), {})


ALL = {
    "resnet18": make_resnet18,
    "data_dependent": make_data_dependent,
    "dict_in_tuple_out": make_dict_in_tuple_out,
    "embedding": make_embedding,
    "tied": make_tied,
    "mlp": make_mlp,
    "small_cnn": make_small_cnn,
    "gpt2": make_gpt2,
    "bert": make_bert,
}
