"""Image-to-image networks: fast neural style transfer and sub-pixel super-resolution (pytorch/examples).

Style transfer: the examples' TransformerNet (reflection-padded convs, InstanceNorm, residual blocks, upsampling
convs; the last conv, ``deconv3``, has no activation) trained on 0-255 images through a small, randomly
initialised and frozen conv feature net (standing in for VGG16, which cannot be downloaded here): content loss
on one feature map with weight 1e5, style loss on Gram matrices of four with weight 1e10, Adam 1e-3, batch 4.

Super-resolution: the examples' sub-pixel CNN (conv 5x5, 3x3, 3x3, 3x3 to r^2 channels, PixelShuffle, ReLUs,
orthogonal initialisation), trained with MSE and Adam; here on 0-255 pixel values for input and target.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import image_split, loader

# --- fast neural style -----------------------------------------------------------------------------------


class ConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2d(self.reflection_pad(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvLayer(channels, channels, 3, 1)
        self.in1 = nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, 3, 1)
        self.in2 = nn.InstanceNorm2d(channels, affine=True)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.in1(self.conv1(x)))
        return self.in2(self.conv2(out)) + x


class UpsampleConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, upsample: int) -> None:
        super().__init__()
        self.upsample = upsample
        self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample:
            x = F.interpolate(x, mode="nearest", scale_factor=self.upsample)
        return self.conv2d(self.reflection_pad(x))


class TransformerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvLayer(3, 8, 9, 1)
        self.in1 = nn.InstanceNorm2d(8, affine=True)
        self.conv2 = ConvLayer(8, 16, 3, 2)
        self.in2 = nn.InstanceNorm2d(16, affine=True)
        self.conv3 = ConvLayer(16, 32, 3, 2)
        self.in3 = nn.InstanceNorm2d(32, affine=True)
        self.res1 = ResidualBlock(32)
        self.res2 = ResidualBlock(32)
        self.deconv1 = UpsampleConvLayer(32, 16, 3, 1, upsample=2)
        self.in4 = nn.InstanceNorm2d(16, affine=True)
        self.deconv2 = UpsampleConvLayer(16, 8, 3, 1, upsample=2)
        self.in5 = nn.InstanceNorm2d(8, affine=True)
        self.deconv3 = ConvLayer(8, 3, 9, 1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.in1(self.conv1(x)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.relu(self.in3(self.conv3(y)))
        y = self.res2(self.res1(y))
        y = self.relu(self.in4(self.deconv1(y)))
        y = self.relu(self.in5(self.deconv2(y)))
        return self.deconv3(y)


class FeatureNet(nn.Module):
    """A VGG-shaped loss network, randomly initialised (fixed seed) and frozen; returns four ReLU feature maps."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2024)
        widths = [(3, 16), (16, 16), (16, 32), (32, 32)]
        self.convs = nn.ModuleList(nn.Conv2d(i, o, 3, padding=1) for i, o in widths)
        with torch.no_grad():
            for conv in self.convs:
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * math.sqrt(2 / conv.weight[0].numel()))
                conv.bias.zero_()
        for p in self.parameters():
            p.requires_grad = False

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for i, conv in enumerate(self.convs):
            x = F.relu(conv(x))
            feats.append(x)
            if i in (1, 2):
                x = F.avg_pool2d(x, 2)
        return feats


def gram_matrix(y: torch.Tensor) -> torch.Tensor:
    b, ch, h, w = y.size()
    features = y.view(b, ch, w * h)
    return features.bmm(features.transpose(1, 2)) / (ch * h * w)


def normalize_batch(batch: torch.Tensor) -> torch.Tensor:
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    return (batch / 255.0 - mean) / std


def style_image() -> torch.Tensor:
    """A synthetic 'painting': coloured diagonal stripes and checks, 0-255."""
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    r = (torch.sin((xs + ys) / 2.0) + 1) * 127.5
    g = (torch.sin(xs / 3.0) * torch.cos(ys / 3.0) + 1) * 127.5
    b = ((xs // 4 + ys // 4) % 2) * 255.0
    return torch.stack([r, g, b]).unsqueeze(0)


def style_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, _, x_test, _ = image_split(384, 64, size=32, channels=3)
    x_train, x_test = x_train.float(), x_test.float()  # the examples' transform: ToTensor then mul(255)
    transformer, vgg = TransformerNet(), FeatureNet()
    optimizer = (
        torch.optim.Adam(transformer.parameters(), hp.lr)
        if hp.optimizer == "adam"
        else torch.optim.SGD(transformer.parameters(), hp.lr)
    )
    prepare = normalize_batch if hp.normalize else (lambda b: b)
    gram_style = [gram_matrix(y) for y in vgg(prepare(style_image()))]

    def losses(x: torch.Tensor, y: torch.Tensor, prep) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
        features_y, features_x = vgg(prep(y)), vgg(prep(x))
        content = hp.content_weight * F.mse_loss(features_y[1], features_x[1])
        style = sum(F.mse_loss(gram_matrix(fy), gs.expand(len(x), -1, -1)) for fy, gs in zip(features_y, gram_style))
        return content, hp.style_weight * style

    batches = loader(x_train, torch.zeros(len(x_train)), hp.batch_size)
    with session.watch(transformer):
        for _epoch in range(hp.epochs):
            transformer.train()
            for x, _ in batches:
                optimizer.zero_grad()
                content_loss, style_loss = losses(x, transformer(x), prepare)
                total_loss = content_loss + style_loss
                total_loss.backward()
                optimizer.step()
                session.record(total_loss)
    transformer.eval()
    with torch.no_grad():  # the correct perceptual loss on held-out content images
        gram_style = [gram_matrix(y) for y in vgg(normalize_batch(style_image()))]
        content_loss, style_loss = losses(x_test, transformer(x_test), normalize_batch)
    return {"metric": float(content_loss + style_loss) if torch.isfinite(content_loss + style_loss) else math.nan}


STYLE = Program(
    family="style_transfer",
    name="fast_neural_style",
    train=style_train,
    defaults=dict(
        lr=1e-3, batch_size=4, epochs=1, content_weight=1e5, style_weight=1e10, optimizer="adam", normalize=True
    ),
    metric="held-out perceptual loss (content + style)",
    higher_is_better=False,
    floor=0.05,
    relative_floor=True,
    chance=None,
    variants=(
        healthy("TransformerNet on 0-255 images, frozen random conv features, content 1e5, style 1e10, Adam"),
        Variant(
            "sgd",
            "optimizer",
            "SGD instead of Adam, same lr 1e-3, on the 1e10-weighted loss",
            {"optimizer": "sgd"},
            K.LR_FAR_TOO_HIGH | {"exploding_gradients", "non_finite"},
        ),
        Variant(
            "no_normalize_batch",
            "data_normalisation",
            "0-255 images fed to the feature net without normalize_batch",
            {"normalize": False},
            K.RAW_INPUTS,
        ),
        Variant("batch_16", "batch_size", "batch size 16 instead of 4", {"batch_size": 16}, K.CAPACITY),
    ),
)


# --- super-resolution ------------------------------------------------------------------------------------


class SuperResolutionNet(nn.Module):
    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 32, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(32, 32, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(32, 16, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(16, upscale_factor**2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        nn.init.orthogonal_(self.conv1.weight, nn.init.calculate_gain("relu"))
        nn.init.orthogonal_(self.conv2.weight, nn.init.calculate_gain("relu"))
        nn.init.orthogonal_(self.conv3.weight, nn.init.calculate_gain("relu"))
        nn.init.orthogonal_(self.conv4.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


def psnr(mse: float) -> float:
    return 10 * math.log10(255.0**2 / mse) if mse > 0 and math.isfinite(mse) else math.nan


def sr_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    hi_train, _, hi_test, _ = image_split(2048, 512, noise=0.1)
    hi_train, hi_test = hi_train.float(), hi_test.float()  # 0-255 pixel values, input and target
    lo_train, lo_test = F.avg_pool2d(hi_train, 2), F.avg_pool2d(hi_test, 2)
    model = SuperResolutionNet(upscale_factor=2)
    optimizer = (
        torch.optim.Adam(model.parameters(), lr=hp.lr)
        if hp.optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=hp.lr)
    )
    criterion = nn.MSELoss()
    batches = loader(lo_train, hi_train, hp.batch_size)
    with session.watch(model):
        for _epoch in range(hp.epochs):
            for x, target in batches:
                optimizer.zero_grad()
                loss = criterion(model(x), target)
                loss.backward()
                optimizer.step()
                session.record(loss)
    with torch.no_grad():
        return {"metric": psnr(float(criterion(model(lo_test), hi_test)))}


SUPER_RESOLUTION = Program(
    family="super_resolution",
    name="sub_pixel_cnn",
    train=sr_train,
    defaults=dict(lr=1e-2, batch_size=64, epochs=8, optimizer="adam"),
    metric="held-out PSNR (dB)",
    higher_is_better=True,
    floor=0.5,
    chance=12.8,  # every pixel predicted as the mean pixel; nearest-neighbour upsampling reaches 19.3
    variants=(
        healthy("conv5-conv3-conv3-conv3-PixelShuffle(2), ReLU, orthogonal init, MSE on 0-255 pixels, Adam 1e-2"),
        Variant(
            "sgd",
            "optimizer",
            "SGD instead of Adam, same lr 1e-2, on 0-255 targets",
            {"optimizer": "sgd"},
            K.LR_FAR_TOO_HIGH | {"exploding_gradients", "non_finite"},
        ),
        Variant("lr_1e-5", "learning_rate", "Adam lr 1e-5", {"lr": 1e-5}, K.LR_TOO_LOW),
    ),
)

PROGRAMS = (STYLE, SUPER_RESOLUTION)
