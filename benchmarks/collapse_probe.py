"""A per-step probe of FCOS's box regression (issue 45), as a Lightning callback, and its table.

    PYTHONPATH=benchmarks python train.py seed=1 augment.partners=dataset model.detector.regression_bias=0.0 \\
        trainer.log_every_n_steps=1 +callbacks.probe._target_=collapse_probe.CollapseProbe \\
        +callbacks.probe.path=/tmp/collapse_probe.json hydra.run.dir=/tmp/collapse
    python benchmarks/collapse_probe.py /tmp/collapse_probe.json --steps 1 9 20 22 23 26 360

Each optimizer step records: the learning rate; the loss terms the module logged; the gradient
norm of the regression head (its shared conv tower, ``bbox_reg`` and ``bbox_ctrness``) and of
the whole model, before clipping; the mean bias and weight norm of ``bbox_reg``; and its raw
outputs before the ReLU, over all levels and on the coarsest (P7): the share above 0, the
largest, the mean. Once no output is above 0, no box has a size and GIoU has no gradient.
"""

from __future__ import annotations

import argparse
import json

import lightning as L
import torch


class CollapseProbe(L.Callback):
    def __init__(self, path: str):
        self.path, self.rows, self.levels, self.grads = path, [], [], (None, None)

    def on_fit_start(self, trainer, pl_module):
        self.conv = next(m for n, m in pl_module.named_modules() if n.endswith("regression_head.bbox_reg"))
        self.conv.register_forward_hook(lambda m, i, o: self.levels.append(o.detach()) if m.training else None)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        norms = {n: p.grad.norm().item() for n, p in pl_module.named_parameters() if p.grad is not None}
        head = sum(v**2 for n, v in norms.items() if "regression_head" in n) ** 0.5
        self.grads = (head, sum(v**2 for v in norms.values()) ** 0.5)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        levels, self.levels = self.levels[-5:], []  # P3-P7 of the step's forward
        every = torch.cat([o.flatten() for o in levels]) if levels else torch.zeros(1)
        p7 = levels[-1] if levels else torch.zeros(1)
        self.rows.append(
            {
                "step": trainer.global_step,
                "lr": trainer.optimizers[0].param_groups[0]["lr"],
                "losses": {
                    k[len("train/") :]: float(v)
                    for k, v in trainer.callback_metrics.items()
                    if k.startswith("train/") and not k.endswith("_epoch")
                },
                "grad_regression_head": self.grads[0],
                "grad_total": self.grads[1],
                "bias_mean": float(self.conv.bias.mean()),
                "weight_norm": float(self.conv.weight.norm()),
                "positive_all": float((every > 0).float().mean()),
                "p7": [float((p7 > 0).float().mean()), float(p7.max()), float(p7.mean())],
            }
        )
        with open(self.path, "w") as f:
            json.dump(self.rows, f)


def table(rows: list[dict], steps: list[int]) -> str:
    lines = [
        "| step | lr | bbox_regression | classification | bbox_ctrness | grad (head / all) | bias | weight norm "
        "| share > 0 (all / P7) | P7 max / mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["step"] not in steps:
            continue
        loss = r["losses"]
        lines.append(
            f"| {r['step']} | {r['lr']:.2e} | {loss.get('bbox_regression', float('nan')):.3f} "
            f"| {loss.get('classification', float('nan')):.3f} | {loss.get('bbox_ctrness', float('nan')):.3f} "
            f"| {r['grad_regression_head']:.2f} / {r['grad_total']:.2f} | {r['bias_mean']:+.5f} "
            f"| {r['weight_norm']:.4f} | {r['positive_all']:.2f} / {r['p7'][0]:.2f} "
            f"| {r['p7'][1]:+.3f} / {r['p7'][2]:+.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", help="the json the callback wrote")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 9, 20, 22, 23, 26, 360])
    args = ap.parse_args()
    with open(args.probe) as f:
        print(table(json.load(f), args.steps))
