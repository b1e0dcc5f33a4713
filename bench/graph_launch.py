"""What a CUDA Graph launch costs the host, by the graph's size and shape.

ganc replays each phase as one `cudaGraphLaunch`, and on an H100 that launch is most of the
host time per replayed phase (timing.json's `replay_launch_seconds`; its `graph_nodes` counts
each phase graph's nodes by kind). This probe captures synthetic graphs of N tiny kernels and
times their launches on the host, so that a phase's launch time can be read against its node
count and shape:

- straight: N kernels on one stream, each after the last;
- forked: the same, with every 16th kernel on a side stream that the main stream waits for
  (the shape a captured phase has: each bucket's all-reduce on the communication stream);
- memcpy: every other node a device-to-device copy instead of a kernel;
- foreach: every other node a multi-tensor kernel (`_foreach_add_` over 8 tensors), whose
  parameter block is kilobytes (the fused optimizer's and the bucket copies' kernels are
  such), where an elementwise kernel's is tens of bytes;
- alternating: two straight graphs launched in turn, A B A B, as a step's phase graphs are
  (the other shapes launch one graph again and again);
- memset: every other node a 4-byte cudaMemsetAsync, a memset node (PyTorch's reductions
  clear their semaphores so, cuDNN its workspaces; ganc makes such nodes kernels by default,
  `--memset-nodes`).

For each, the median host time of `cudaGraphLaunch` (through torch.cuda.CUDAGraph.replay)
with the GPU idle at the launch (synchronised after each) and the fitted cost per node; then
the GPU time of one replay (CUDA events around back-to-back replays) and its cost per node,
which says what a node of each kind costs the device (the idle between nodes included).

    python3 bench/graph_launch.py [--nodes 1,32,128,512] [--launches 200] [--json PATH]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

import torch


def cuda_memset_async():
    """cudaMemsetAsync from the CUDA runtime torch loaded (torch has no call that makes a
    memset node by itself)."""
    major = int(torch.version.cuda.split(".")[0])
    runtime = ctypes.CDLL(f"libcudart.so.{major}")  # the library already loaded, by its soname
    runtime.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    runtime.cudaMemsetAsync.restype = ctypes.c_int
    return runtime.cudaMemsetAsync


def capture(nodes: int, shape: str):
    """The graph and the buffers its replays use (kept alive with it)."""
    x = torch.zeros(256, device="cuda")
    y = torch.zeros(256, device="cuda")
    many = [torch.zeros(256, device="cuda") for _ in range(8)]
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # allocator and kernels warmed outside the capture
        x.add_(1.0)
        y.copy_(x)
        torch._foreach_add_(many, 1.0)
    torch.cuda.current_stream().wait_stream(warm)
    with torch.cuda.graph(graph):
        for i in range(nodes):
            if shape == "forked" and i % 16 == 15:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    y.add_(1.0)
                torch.cuda.current_stream().wait_stream(side)
            elif shape == "memcpy" and i % 2 == 1:
                y.copy_(x)  # contiguous, same dtype and device: cudaMemcpyAsync, a memcpy node
            elif shape == "foreach" and i % 2 == 1:
                torch._foreach_add_(many, 1.0)  # one multi_tensor_apply kernel
            elif shape == "memset" and i % 2 == 1:
                status = cuda_memset_async()(y.data_ptr(), 0, 4, torch.cuda.current_stream().cuda_stream)
                assert status == 0, f"cudaMemsetAsync failed: error {status}"
            else:
                x.add_(1.0)
    return graph, (x, y, many, side)


def launch_seconds(graphs, launches: int) -> float:
    """The median host time of one launch, the graphs launched in turn."""
    for graph in graphs:
        graph.replay()  # the first launch uploads the graph
    torch.cuda.synchronize()
    times = []
    for i in range(launches):
        graph = graphs[i % len(graphs)]
        start = time.perf_counter()
        graph.replay()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times)


def gpu_seconds(graphs, launches: int) -> float:
    """The GPU time of one launch: back-to-back launches between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(launches):
        graphs[i % len(graphs)].replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / launches


def measure(nodes: int, shape: str, launches: int):
    """(host seconds of a launch, GPU seconds of a launch)."""
    if shape == "alternating":
        captured = [capture(nodes, "straight") for _ in range(2)]
    else:
        captured = [capture(nodes, shape)]
    graphs = [graph for graph, _ in captured]
    return launch_seconds(graphs, launches), gpu_seconds(graphs, launches)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,32,128,512")
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--json", help="also write every number here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_launch.py needs a CUDA GPU")
    sizes = [int(n) for n in args.nodes.split(",")]
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "shapes": {}}
    print(f"{results['device']}, torch {torch.__version__}: host time of one graph launch, GPU idle "
          f"(median of {args.launches})")
    print(f"{'shape':12}" + "".join(f"{n:>9} nodes" for n in sizes) + "   per node")
    gpu_lines = []
    for shape in ("straight", "forked", "memcpy", "foreach", "alternating", "memset"):
        measured = [measure(n, shape, args.launches) for n in sizes]
        seconds, gpu = [m[0] for m in measured], [m[1] for m in measured]
        # The least-squares slope: the launch's cost per node.
        def per_node(values):
            return statistics.linear_regression(sizes, values).slope if len(set(sizes)) > 1 else 0.0
        slope = per_node(seconds)
        results["shapes"][shape] = {"nodes": sizes, "seconds": seconds, "seconds_per_node": slope,
                                    "gpu_seconds": gpu, "gpu_seconds_per_node": per_node(gpu)}
        print(f"{shape:12}" + "".join(f"{s * 1e6:12.1f} us" for s in seconds) + f"  {slope * 1e6:8.3f} us",
              flush=True)
        gpu_lines.append(f"{shape:12}" + "".join(f"{s * 1e6:12.1f} us" for s in gpu) +
                         f"  {per_node(gpu) * 1e6:8.3f} us")
    print(f"GPU time of one launch (back-to-back launches, {args.launches} timed by CUDA events)")
    print("\n".join(gpu_lines), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
