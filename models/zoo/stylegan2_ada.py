"""StyleGAN2 written the way NVIDIA's stylegan2-ada-pytorch writes its networks, exported
without edits: `**kwargs` forwards, a persistence-style class decorator, `assert_shape` helpers,
numpy constants, an autograd.Function convolution with its own (double) backward, a fused
multiply-add Function, a bias + activation op with a reference fallback, upfirdn2d written with
pads and a filter convolution, and random noise inputs inside the synthesis layers.

None of this scripts; `ganc.export` traces the networks at the shapes the phases call them with
and scripts the phases (so R1 and path length keep their double backward). The phases are the
GAN module's own methods (the loss of StyleGAN2-ADA's `StyleGAN2Loss`): Gmain, Gpl (path length
every 4 steps), Dmain, Dreg (R1 every 16 steps), G_ema averaged after every step.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import warnings

import numpy as np
import torch
import torch.nn as nn


# ---------------------------------------------------------------------------------------------
# torch_utils/persistence.py: the decorator records the constructor's arguments (StyleGAN's
# pickles rebuild networks from them); the class the networks have is its subclass.

def persistent_class(orig_class):
    class Decorator(orig_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._init_args = copy.deepcopy(args)
            self._init_kwargs = copy.deepcopy(kwargs)

        @property
        def init_args(self):
            return copy.deepcopy(self._init_args)

        @property
        def init_kwargs(self):
            return dict(copy.deepcopy(self._init_kwargs))

    Decorator.__name__ = orig_class.__name__
    Decorator.__qualname__ = orig_class.__qualname__
    return Decorator


# ---------------------------------------------------------------------------------------------
# torch_utils/misc.py

@contextlib.contextmanager
def suppress_tracer_warnings():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def assert_shape(tensor, ref_shape):
    if tensor.ndim != len(ref_shape):
        raise AssertionError(f"Wrong number of dimensions: got {tensor.ndim}, expected {len(ref_shape)}")
    for idx, (size, ref_size) in enumerate(zip(tensor.shape, ref_shape)):
        if ref_size is None:
            pass
        elif isinstance(size, torch.Tensor):
            with suppress_tracer_warnings():
                torch._assert(torch.equal(size, torch.as_tensor(ref_size)), f"Wrong size for dimension {idx}")
        elif size != ref_size:
            raise AssertionError(f"Wrong size for dimension {idx}: got {size}, expected {ref_size}")


# ---------------------------------------------------------------------------------------------
# torch_ops/fma.py: a fused multiply-add with a hand-written backward.

def fma(a, b, c):
    return _FusedMultiplyAdd.apply(a, b, c)


class _FusedMultiplyAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c):
        out = torch.addcmul(c, a, b)
        ctx.save_for_backward(a, b)
        ctx.c_shape = c.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        a, b = ctx.saved_tensors
        c_shape = ctx.c_shape
        da = db = dc = None
        if ctx.needs_input_grad[0]:
            da = _unbroadcast(dout * b, a.shape)
        if ctx.needs_input_grad[1]:
            db = _unbroadcast(dout * a, b.shape)
        if ctx.needs_input_grad[2]:
            dc = _unbroadcast(dout, c_shape)
        return da, db, dc


def _unbroadcast(x, shape):
    extra_dims = x.ndim - len(shape)
    dim = [i for i in range(x.ndim) if x.shape[i] > 1 and (i < extra_dims or shape[i - extra_dims] == 1)]
    if len(dim):
        x = x.sum(dim=dim, keepdim=True)
    if extra_dims:
        x = x.reshape(-1, *x.shape[extra_dims + 1:])
    return x


# ---------------------------------------------------------------------------------------------
# torch_ops/conv2d_gradfix.py: convolution as an autograd.Function whose backward is written
# with convolution_backward, and whose weight gradient is a Function of its own, so R1 and path
# length (double backward) work. StyleGAN uses it on CUDA; here it runs everywhere.

def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv2d_gradfix(weight.shape, stride, padding, dilation, groups).apply(input, weight, bias)


@functools.lru_cache(maxsize=None)
def _conv2d_gradfix(weight_shape, stride, padding, dilation, groups):
    ndim = 2
    weight_shape = tuple(weight_shape)
    stride, padding, dilation = ((v,) * ndim if isinstance(v, int) else tuple(v)
                                 for v in (stride, padding, dilation))
    common = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    class Conv2d(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, weight, bias):
            ctx.save_for_backward(input, weight)
            return torch.nn.functional.conv2d(input=input, weight=weight, bias=bias, **common)

        @staticmethod
        def backward(ctx, grad_output):
            input, weight = ctx.saved_tensors
            grad_input = grad_weight = grad_bias = None
            if ctx.needs_input_grad[0]:
                grad_input = torch.nn.functional.conv_transpose2d(
                    grad_output, weight, stride=stride, padding=padding, dilation=dilation,
                    groups=groups, output_padding=_output_padding(input.shape, grad_output.shape))
            if ctx.needs_input_grad[1]:
                grad_weight = Conv2dGradWeight.apply(grad_output, input)
            if ctx.needs_input_grad[2]:
                grad_bias = grad_output.sum([0, 2, 3])
            return grad_input, grad_weight, grad_bias

    class Conv2dGradWeight(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grad_output, input):
            ctx.save_for_backward(grad_output, input)
            empty = input.new_empty(weight_shape)
            return torch.ops.aten.convolution_backward(
                grad_output, input, empty, None, stride, padding, dilation, False, [0, 0], groups,
                [False, True, False])[1]

        @staticmethod
        def backward(ctx, grad2_grad_weight):
            grad_output, input = ctx.saved_tensors
            grad2_grad_output = grad2_input = None
            if ctx.needs_input_grad[0]:
                grad2_grad_output = Conv2d.apply(input, grad2_grad_weight, None)
            if ctx.needs_input_grad[1]:
                grad2_input = torch.nn.functional.conv_transpose2d(
                    grad_output, grad2_grad_weight, stride=stride, padding=padding, dilation=dilation,
                    groups=groups, output_padding=_output_padding(input.shape, grad_output.shape))
            return grad2_grad_output, grad2_input

    def _output_padding(input_shape, output_shape):
        return [input_shape[i + 2] - (output_shape[i + 2] - 1) * stride[i] - (1 - 2 * padding[i])
                - dilation[i] * (weight_shape[i + 2] - 1) for i in range(ndim)]

    return Conv2d


# ---------------------------------------------------------------------------------------------
# torch_ops/bias_act.py: bias, activation, gain and clamp; StyleGAN runs a CUDA kernel where it
# can and this reference elsewhere.

activation_funcs = {
    "linear": dict(func=lambda x, **_: x, def_gain=1),
    "lrelu": dict(func=lambda x, alpha, **_: torch.nn.functional.leaky_relu(x, alpha), def_alpha=0.2,
                  def_gain=np.sqrt(2)),
}


def bias_act(x, b=None, dim=1, act="linear", alpha=None, gain=None, clamp=None, impl="ref"):
    spec = activation_funcs[act]
    alpha = float(alpha if alpha is not None else spec.get("def_alpha", 0))
    gain = float(gain if gain is not None else spec["def_gain"])
    clamp = float(clamp if clamp is not None else -1)
    if b is not None:
        assert isinstance(b, torch.Tensor) and b.ndim == 1
        x = x + b.reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    x = spec["func"](x, alpha=alpha)
    if gain != 1:
        x = x * gain
    if clamp >= 0:
        x = x.clamp(-clamp, clamp)
    return x


# ---------------------------------------------------------------------------------------------
# torch_ops/upfirdn2d.py (the reference path)

def setup_filter(f, normalize=True, flip_filter=False, gain=1):
    f = torch.as_tensor(np.asarray(f, dtype=np.float32))
    f = f.ger(f)
    if normalize:
        f /= f.sum()
    if flip_filter:
        f = f.flip(list(range(f.ndim)))
    return f * gain


def upfirdn2d(x, f, up=1, down=1, padding=(0, 0, 0, 0), gain=1):
    batch, channels, in_h, in_w = x.shape
    px0, px1, py0, py1 = padding
    x = x.reshape([batch, channels, in_h, 1, in_w, 1])
    x = torch.nn.functional.pad(x, [0, up - 1, 0, 0, 0, up - 1])
    x = x.reshape([batch, channels, in_h * up, in_w * up])
    x = torch.nn.functional.pad(x, [max(px0, 0), max(px1, 0), max(py0, 0), max(py1, 0)])
    f = f * (gain ** (f.ndim / 2))
    f = f.flip(list(range(f.ndim)))[np.newaxis, np.newaxis].repeat([channels, 1, 1, 1])
    x = torch.nn.functional.conv2d(input=x, weight=f.to(x.dtype), groups=channels)
    return x[:, :, ::down, ::down]


def upsample2d(x, f, up=2):
    fw = f.shape[-1]
    p = [(fw + up - 1) // 2, (fw - up) // 2] * 2
    return upfirdn2d(x, f, up=up, padding=p, gain=up * up)


def downsample2d(x, f, down=2):
    fw = f.shape[-1]
    p = [(fw - down + 1) // 2, (fw - down) // 2] * 2
    return upfirdn2d(x, f, down=down, padding=p)


# ---------------------------------------------------------------------------------------------
# training/networks.py

def normalize_2nd_moment(x, dim=1, eps=1e-8):
    return x * (x.square().mean(dim=dim, keepdim=True) + eps).rsqrt()


def modulated_conv2d(x, weight, styles, noise=None, up=1, padding=0, resample_filter=None,
                     demodulate=True, flip_weight=True, fused_modconv=True):
    batch_size = x.shape[0]
    out_channels, in_channels, kh, kw = weight.shape
    assert_shape(weight, [out_channels, in_channels, kh, kw])
    assert_shape(x, [batch_size, in_channels, None, None])
    assert_shape(styles, [batch_size, in_channels])
    w = weight.unsqueeze(0) * styles.reshape(batch_size, 1, -1, 1, 1)
    if demodulate:
        dcoefs = (w.square().sum(dim=[2, 3, 4]) + 1e-8).rsqrt()
        w = w * dcoefs.reshape(batch_size, -1, 1, 1, 1)
    if up > 1:
        x = upsample2d(x, resample_filter, up=up)
    x = x.reshape(1, -1, *x.shape[2:])
    w = w.reshape(-1, in_channels, kh, kw)
    x = conv2d(x, w.to(x.dtype), padding=padding, groups=batch_size)
    x = x.reshape(batch_size, -1, *x.shape[2:])
    if noise is not None:
        x = fma(x, torch.ones([], dtype=x.dtype), noise.to(x.dtype))  # StyleGAN's x.add_(noise)
    return x


@persistent_class
class FullyConnectedLayer(nn.Module):
    def __init__(self, in_features, out_features, bias=True, activation="linear", lr_multiplier=1,
                 bias_init=0):
        super().__init__()
        self.activation = activation
        self.weight = nn.Parameter(torch.randn([out_features, in_features]) / lr_multiplier)
        self.bias = nn.Parameter(torch.full([out_features], np.float32(bias_init))) if bias else None
        self.weight_gain = lr_multiplier / np.sqrt(in_features)
        self.bias_gain = lr_multiplier

    def forward(self, x):
        w = self.weight.to(x.dtype) * self.weight_gain
        b = self.bias
        if b is not None:
            b = b.to(x.dtype)
            if self.bias_gain != 1:
                b = b * self.bias_gain
        if self.activation == "linear" and b is not None:
            x = torch.addmm(b.unsqueeze(0), x, w.t())
        else:
            x = x.matmul(w.t())
            x = bias_act(x, b, act=self.activation)
        return x


@persistent_class
class Conv2dLayer(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias=True, activation="linear", up=1,
                 down=1, resample_filter=(1, 3, 3, 1), conv_clamp=None):
        super().__init__()
        self.activation = activation
        self.up = up
        self.down = down
        self.conv_clamp = conv_clamp
        self.register_buffer("resample_filter", setup_filter(resample_filter))
        self.padding = kernel_size // 2
        self.weight_gain = 1 / np.sqrt(in_channels * (kernel_size ** 2))
        self.act_gain = activation_funcs[activation]["def_gain"]
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, kernel_size, kernel_size]))
        self.bias = nn.Parameter(torch.zeros([out_channels])) if bias else None

    def forward(self, x, gain=1):
        w = self.weight * self.weight_gain
        b = self.bias.to(x.dtype) if self.bias is not None else None
        if self.down > 1:
            x = downsample2d(x, self.resample_filter, down=self.down)
        x = conv2d(x, w.to(x.dtype), padding=self.padding)
        act_gain = self.act_gain * gain
        act_clamp = self.conv_clamp * gain if self.conv_clamp is not None else None
        return bias_act(x, b, act=self.activation, gain=act_gain, clamp=act_clamp)


@persistent_class
class MappingNetwork(nn.Module):
    def __init__(self, z_dim, c_dim, w_dim, num_ws, num_layers=8, activation="lrelu", lr_multiplier=0.01,
                 w_avg_beta=0.995):
        super().__init__()
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.num_ws = num_ws
        self.num_layers = num_layers
        self.w_avg_beta = w_avg_beta
        features_list = [z_dim] + [w_dim] * num_layers
        for idx in range(num_layers):
            layer = FullyConnectedLayer(features_list[idx], features_list[idx + 1], activation=activation,
                                        lr_multiplier=lr_multiplier)
            setattr(self, f"fc{idx}", layer)
        self.register_buffer("w_avg", torch.zeros([w_dim]))

    def forward(self, z, c=None, truncation_psi=1, truncation_cutoff=None, update_emas=False):
        assert_shape(z, [None, self.z_dim])
        x = normalize_2nd_moment(z.to(self.w_avg.dtype))  # (stylegan2-ada: float32)
        for idx in range(self.num_layers):
            x = getattr(self, f"fc{idx}")(x)
        if update_emas and self.w_avg_beta is not None:
            self.w_avg.copy_(x.detach().mean(dim=0).lerp(self.w_avg, self.w_avg_beta))
        x = x.unsqueeze(1).repeat([1, self.num_ws, 1])
        if truncation_psi != 1:
            x = self.w_avg.lerp(x, truncation_psi)
        return x


@persistent_class
class SynthesisLayer(nn.Module):
    def __init__(self, in_channels, out_channels, w_dim, resolution, kernel_size=3, up=1, use_noise=True,
                 activation="lrelu", resample_filter=(1, 3, 3, 1), conv_clamp=None):
        super().__init__()
        self.resolution = resolution
        self.up = up
        self.use_noise = use_noise
        self.activation = activation
        self.conv_clamp = conv_clamp
        self.register_buffer("resample_filter", setup_filter(resample_filter))
        self.padding = kernel_size // 2
        self.act_gain = activation_funcs[activation]["def_gain"]
        self.affine = FullyConnectedLayer(w_dim, in_channels, bias_init=1)
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, kernel_size, kernel_size]))
        if use_noise:
            self.register_buffer("noise_const", torch.randn([resolution, resolution]))
            self.noise_strength = nn.Parameter(torch.zeros([]))
        self.bias = nn.Parameter(torch.zeros([out_channels]))

    def forward(self, x, w, noise_mode="random", fused_modconv=True, gain=1):
        assert noise_mode in ["random", "const", "none"]
        in_resolution = self.resolution // self.up
        assert_shape(x, [None, self.weight.shape[1], in_resolution, in_resolution])
        styles = self.affine(w)
        noise = None
        if self.use_noise and noise_mode == "random":
            noise = torch.randn([x.shape[0], 1, self.resolution, self.resolution], device=x.device) \
                * self.noise_strength
        if self.use_noise and noise_mode == "const":
            noise = self.noise_const * self.noise_strength
        flip_weight = self.up == 1
        x = modulated_conv2d(x=x, weight=self.weight, styles=styles, noise=noise, up=self.up,
                             padding=self.padding, resample_filter=self.resample_filter,
                             flip_weight=flip_weight, fused_modconv=fused_modconv)
        act_gain = self.act_gain * gain
        act_clamp = self.conv_clamp * gain if self.conv_clamp is not None else None
        return bias_act(x, self.bias.to(x.dtype), act=self.activation, gain=act_gain, clamp=act_clamp)


@persistent_class
class ToRGBLayer(nn.Module):
    def __init__(self, in_channels, out_channels, w_dim, kernel_size=1, conv_clamp=None):
        super().__init__()
        self.conv_clamp = conv_clamp
        self.affine = FullyConnectedLayer(w_dim, in_channels, bias_init=1)
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, kernel_size, kernel_size]))
        self.bias = nn.Parameter(torch.zeros([out_channels]))
        self.weight_gain = 1 / np.sqrt(in_channels * (kernel_size ** 2))

    def forward(self, x, w, fused_modconv=True):
        styles = self.affine(w) * self.weight_gain
        x = modulated_conv2d(x=x, weight=self.weight, styles=styles, demodulate=False,
                             fused_modconv=fused_modconv)
        return bias_act(x, self.bias.to(x.dtype), clamp=self.conv_clamp)


@persistent_class
class SynthesisBlock(nn.Module):
    def __init__(self, in_channels, out_channels, w_dim, resolution, img_channels, is_last,
                 resample_filter=(1, 3, 3, 1), conv_clamp=None, **layer_kwargs):
        super().__init__()
        self.in_channels = in_channels
        self.w_dim = w_dim
        self.resolution = resolution
        self.img_channels = img_channels
        self.is_last = is_last
        self.register_buffer("resample_filter", setup_filter(resample_filter))
        self.num_conv = 0
        self.num_torgb = 0
        if in_channels == 0:
            self.const = nn.Parameter(torch.randn([out_channels, resolution, resolution]))
        if in_channels != 0:
            self.conv0 = SynthesisLayer(in_channels, out_channels, w_dim=w_dim, resolution=resolution, up=2,
                                        resample_filter=resample_filter, conv_clamp=conv_clamp, **layer_kwargs)
            self.num_conv += 1
        self.conv1 = SynthesisLayer(out_channels, out_channels, w_dim=w_dim, resolution=resolution,
                                    conv_clamp=conv_clamp, **layer_kwargs)
        self.num_conv += 1
        self.torgb = ToRGBLayer(out_channels, img_channels, w_dim=w_dim, conv_clamp=conv_clamp)
        self.num_torgb += 1

    def forward(self, x, img, ws, force_fp32=False, fused_modconv=None, **layer_kwargs):
        assert_shape(ws, [None, self.num_conv + self.num_torgb, self.w_dim])
        w_iter = iter(ws.unbind(dim=1))
        if self.in_channels == 0:
            x = self.const.to(ws.dtype)
            x = x.unsqueeze(0).repeat([ws.shape[0], 1, 1, 1])
        else:
            assert_shape(x, [None, self.in_channels, self.resolution // 2, self.resolution // 2])
        if self.in_channels == 0:
            x = self.conv1(x, next(w_iter), **layer_kwargs)
        else:
            x = self.conv0(x, next(w_iter), **layer_kwargs)
            x = self.conv1(x, next(w_iter), **layer_kwargs)
        if img is not None:
            assert_shape(img, [None, self.img_channels, self.resolution // 2, self.resolution // 2])
            img = upsample2d(img, self.resample_filter)
        y = self.torgb(x, next(w_iter))
        img = img.add_(y) if img is not None else y
        return x, img


def _float32_only(num_fp16_res):
    """These networks compute in float32: train.py's float16 layers (num_fp16_res > 0) are refused."""
    if num_fp16_res:
        raise ValueError(f"zoo.stylegan2_ada computes in float32 only: num_fp16_res={num_fp16_res} is not taken "
                         "(train.py's --fp32 1 sets it to 0)")


@persistent_class
class SynthesisNetwork(nn.Module):
    def __init__(self, w_dim, img_resolution, img_channels, channel_base=32768, channel_max=512, num_fp16_res=0,
                 **block_kwargs):
        super().__init__()
        _float32_only(num_fp16_res)
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_resolution_log2 = int(np.log2(img_resolution))
        self.img_channels = img_channels
        self.block_resolutions = [2 ** i for i in range(2, self.img_resolution_log2 + 1)]
        channels_dict = {res: min(channel_base // res, channel_max) for res in self.block_resolutions}
        self.num_ws = 0
        for res in self.block_resolutions:
            in_channels = channels_dict[res // 2] if res > 4 else 0
            out_channels = channels_dict[res]
            is_last = (res == self.img_resolution)
            block = SynthesisBlock(in_channels, out_channels, w_dim=w_dim, resolution=res,
                                   img_channels=img_channels, is_last=is_last, **block_kwargs)
            self.num_ws += block.num_conv
            if is_last:
                self.num_ws += block.num_torgb
            setattr(self, f"b{res}", block)

    def forward(self, ws, **block_kwargs):
        block_ws = []
        assert_shape(ws, [None, self.num_ws, self.w_dim])
        ws = ws.to(self.b4.const.dtype)
        w_idx = 0
        for res in self.block_resolutions:
            block = getattr(self, f"b{res}")
            block_ws.append(ws.narrow(1, w_idx, block.num_conv + block.num_torgb))
            w_idx += block.num_conv
        x = img = None
        for res, cur_ws in zip(self.block_resolutions, block_ws):
            block = getattr(self, f"b{res}")
            x, img = block(x, img, cur_ws, **block_kwargs)
        return img


@persistent_class
class Generator(nn.Module):
    def __init__(self, z_dim, c_dim, w_dim, img_resolution, img_channels, mapping_kwargs={},
                 synthesis_kwargs={}):
        super().__init__()
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.synthesis = SynthesisNetwork(w_dim=w_dim, img_resolution=img_resolution,
                                          img_channels=img_channels, **synthesis_kwargs)
        self.num_ws = self.synthesis.num_ws
        self.mapping = MappingNetwork(z_dim=z_dim, c_dim=c_dim, w_dim=w_dim, num_ws=self.num_ws,
                                      **mapping_kwargs)

    def forward(self, z, c=None, truncation_psi=1, truncation_cutoff=None, update_emas=False,
                **synthesis_kwargs):
        ws = self.mapping(z, c, truncation_psi=truncation_psi, truncation_cutoff=truncation_cutoff,
                          update_emas=update_emas)
        return self.synthesis(ws, **synthesis_kwargs)


@persistent_class
class DiscriminatorBlock(nn.Module):
    def __init__(self, in_channels, tmp_channels, out_channels, resolution, img_channels, first_layer_idx,
                 activation="lrelu", resample_filter=(1, 3, 3, 1), conv_clamp=None):
        super().__init__()
        self.in_channels = in_channels
        self.resolution = resolution
        self.img_channels = img_channels
        self.register_buffer("resample_filter", setup_filter(resample_filter))
        if in_channels == 0:
            self.fromrgb = Conv2dLayer(img_channels, tmp_channels, kernel_size=1, activation=activation,
                                       conv_clamp=conv_clamp)
        self.conv0 = Conv2dLayer(tmp_channels, tmp_channels, kernel_size=3, activation=activation,
                                 conv_clamp=conv_clamp)
        self.conv1 = Conv2dLayer(tmp_channels, out_channels, kernel_size=3, activation=activation, down=2,
                                 resample_filter=resample_filter, conv_clamp=conv_clamp)
        self.skip = Conv2dLayer(tmp_channels, out_channels, kernel_size=1, bias=False, down=2,
                                resample_filter=resample_filter)

    def forward(self, x, img, force_fp32=False):
        if self.in_channels == 0:
            assert_shape(img, [None, self.img_channels, self.resolution, self.resolution])
            x = self.fromrgb(img)
        y = self.skip(x, gain=np.sqrt(0.5))
        x = self.conv0(x)
        x = self.conv1(x, gain=np.sqrt(0.5))
        x = y.add_(x)
        return x, None


@persistent_class
class MinibatchStdLayer(nn.Module):
    def __init__(self, group_size, num_channels=1):
        super().__init__()
        self.group_size = group_size
        self.num_channels = num_channels

    def forward(self, x):
        N, C, H, W = x.shape
        with suppress_tracer_warnings():  # as_tensor results are registered as constants
            G = torch.min(torch.as_tensor(self.group_size), torch.as_tensor(N)) if self.group_size is not None else N
        F = self.num_channels
        c = C // F
        y = x.reshape(G, -1, F, c, H, W)
        y = y - y.mean(dim=0)
        y = y.square().mean(dim=0)
        y = (y + 1e-8).sqrt()
        y = y.mean(dim=[2, 3, 4])
        y = y.reshape(-1, F, 1, 1)
        y = y.repeat(G, 1, H, W)
        return torch.cat([x, y], dim=1)


@persistent_class
class DiscriminatorEpilogue(nn.Module):
    def __init__(self, in_channels, cmap_dim, resolution, img_channels, mbstd_group_size=4,
                 mbstd_num_channels=1, activation="lrelu", conv_clamp=None):
        super().__init__()
        self.in_channels = in_channels
        self.resolution = resolution
        self.mbstd = MinibatchStdLayer(group_size=mbstd_group_size, num_channels=mbstd_num_channels)
        self.conv = Conv2dLayer(in_channels + mbstd_num_channels, in_channels, kernel_size=3,
                                activation=activation, conv_clamp=conv_clamp)
        self.fc = FullyConnectedLayer(in_channels * (resolution ** 2), in_channels, activation=activation)
        self.out = FullyConnectedLayer(in_channels, 1 if cmap_dim == 0 else cmap_dim)

    def forward(self, x, img, cmap, force_fp32=False):
        assert_shape(x, [None, self.in_channels, self.resolution, self.resolution])
        x = self.mbstd(x)
        x = self.conv(x)
        x = self.fc(x.flatten(1))
        return self.out(x)


@persistent_class
class Discriminator(nn.Module):
    def __init__(self, c_dim, img_resolution, img_channels, channel_base=32768, channel_max=512, num_fp16_res=0,
                 conv_clamp=None, block_kwargs={}, mapping_kwargs={}, epilogue_kwargs={}):
        super().__init__()
        _float32_only(num_fp16_res)
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_resolution_log2 = int(np.log2(img_resolution))
        self.img_channels = img_channels
        self.block_resolutions = [2 ** i for i in range(self.img_resolution_log2, 2, -1)]
        channels_dict = {res: min(channel_base // res, channel_max) for res in self.block_resolutions + [4]}
        common_kwargs = dict(img_channels=img_channels, conv_clamp=conv_clamp)
        cur_layer_idx = 0
        for res in self.block_resolutions:
            in_channels = channels_dict[res] if res < img_resolution else 0
            block = DiscriminatorBlock(in_channels, channels_dict[res], channels_dict[res // 2], resolution=res,
                                       first_layer_idx=cur_layer_idx, **block_kwargs, **common_kwargs)
            setattr(self, f"b{res}", block)
        self.b4 = DiscriminatorEpilogue(channels_dict[4], cmap_dim=0, resolution=4, **epilogue_kwargs,
                                        **common_kwargs)

    def forward(self, img, c=None, update_emas=False, **block_kwargs):
        x = None
        for res in self.block_resolutions:
            block = getattr(self, f"b{res}")
            x, img = block(x, img, **block_kwargs)
        return self.b4(x, img, None)


# ---------------------------------------------------------------------------------------------
# The GAN: StyleGAN2-ADA's StyleGAN2Loss as one phase method per accumulate_gradients phase.

class StyleGAN2ADA(nn.Module):
    def __init__(self, z_dim=32, w_dim=32, resolution=16, channel_base=512, channel_max=32,
                 mapping_layers=2, r1_gamma=1.0, pl_weight=2.0, pl_decay=0.01, pl_batch_shrink=2,
                 g_reg_interval=4, d_reg_interval=16):
        super().__init__()
        self.G = Generator(z_dim=z_dim, c_dim=0, w_dim=w_dim, img_resolution=resolution, img_channels=3,
                           mapping_kwargs=dict(num_layers=mapping_layers),
                           synthesis_kwargs=dict(channel_base=channel_base, channel_max=channel_max))
        self.D = Discriminator(c_dim=0, img_resolution=resolution, img_channels=3, channel_base=channel_base,
                               channel_max=channel_max)
        self.G_ema = copy.deepcopy(self.G).eval().requires_grad_(False)
        self.register_buffer("pl_mean", torch.zeros([]))
        self.r1_gamma = r1_gamma
        self.pl_weight = pl_weight
        self.pl_decay = pl_decay
        self.pl_batch_shrink = pl_batch_shrink
        self.g_reg_interval = g_reg_interval
        self.d_reg_interval = d_reg_interval

    def phase_gmain(self, gen_z):
        gen_img = self.G.synthesis(self.G.mapping(gen_z))
        return torch.nn.functional.softplus(-self.D(gen_img)).mean()

    def phase_gpl(self, gen_z):
        batch_size = gen_z.shape[0] // self.pl_batch_shrink
        gen_ws = self.G.mapping(gen_z[:batch_size])
        gen_img = self.G.synthesis(gen_ws)
        pl_noise = torch.randn_like(gen_img) / math.sqrt(gen_img.shape[2] * gen_img.shape[3])
        pl_grads = torch.autograd.grad([(gen_img * pl_noise).sum()], [gen_ws], create_graph=True)[0]
        assert pl_grads is not None
        pl_lengths = pl_grads.square().sum(2).mean(1).sqrt()
        pl_mean = self.pl_mean.lerp(pl_lengths.mean().detach(), self.pl_decay)
        self.pl_mean.copy_(pl_mean)
        pl_penalty = (pl_lengths - pl_mean).square()
        return (pl_penalty * self.pl_weight).mean() * self.g_reg_interval

    def phase_dmain(self, real_img, gen_z):
        gen_img = self.G.synthesis(self.G.mapping(gen_z)).detach()
        loss_gen = torch.nn.functional.softplus(self.D(gen_img)).mean()
        loss_real = torch.nn.functional.softplus(-self.D(real_img)).mean()
        return loss_gen + loss_real

    def phase_dreg(self, real_img):
        real_img_tmp = real_img.detach().requires_grad_(True)
        real_logits = self.D(real_img_tmp)
        r1_grads = torch.autograd.grad([real_logits.sum()], [real_img_tmp], create_graph=True)[0]
        assert r1_grads is not None
        r1_penalty = r1_grads.square().sum([1, 2, 3])
        return (r1_penalty * (self.r1_gamma / 2)).mean() * self.d_reg_interval


def stylegan2_ada_spec(name, batch=8, z_dim=32, resolution=16, lr=0.0025, g_reg=4, d_reg=16):
    """StyleGAN2-ADA's optimizers: Adam(betas=(0, 0.99)), lr and betas scaled by k/(k+1) for a
    network regularised every k steps; G_ema's half-life in images."""
    def adam(k):
        ratio = k / (k + 1)
        return {"type": "adam", "lr": lr * ratio, "betas": [0.0, 0.99 ** ratio], "eps": 1e-8,
                "weight_decay": 0.0}

    z = {"name": "gen_z", "source": "normal", "shape": [z_dim]}
    real = {"name": "real_img", "source": "data"}
    return {
        "ganc_spec": 1, "name": name, "batch_size": batch, "data": {"shape": [3, resolution, resolution]},
        "phases": [
            {"name": "Gmain", "method": "phase_gmain", "updates": ["G"], "inputs": [z]},
            {"name": "Gpl", "method": "phase_gpl", "updates": ["G"], "interval": g_reg, "inputs": [z]},
            {"name": "Dmain", "method": "phase_dmain", "updates": ["D"], "inputs": [real, z]},
            {"name": "Dreg", "method": "phase_dreg", "updates": ["D"], "interval": d_reg, "inputs": [real]},
        ],
        "optimizers": {"G": adam(g_reg), "D": adam(d_reg)},
        "buffers": "local",
        "ema": {"submodule": "G", "copy": "G_ema", "half_life_images": 500},
        "sample": {"submodule": "G_ema", "noise_shape": [z_dim]},
    }
