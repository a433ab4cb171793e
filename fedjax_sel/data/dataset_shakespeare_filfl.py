"""Shakespeare with FilFL's filtering set: part of the FilFL paper's own introduction.

FilFL's Shakespeare experiments (Fourati et al. 2024, section 5.1 and Fig. 8) filter on a small
set from a *different distribution* than the clients' plays: 80-character windows of the
paper's introduction (34, 17 or 8 samples). This module registers ``shakespeare_filfl``: the
``shakespeare`` data set of the engine (one client per speaking role) whose server-held set
(``server_x``/``server_y``) holds ``filter_samples`` consecutive windows of that text, taken
every ``filter_stride`` characters (non-overlapping by default), with the next character as the
target, in LEAF's vocabulary.

The text is the first paragraphs of the paper's Introduction (CC BY-NC 4.0, Fourati, Kharrat,
Aggarwal, Alouini and Canini, ECAI 2024), citations kept, a footnote mark and LaTeX dropped.
The paper's exact selection (its appendix Table 3) is not available offline; these are the same
paragraphs' opening 80-character windows.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data import shakespeare
from fedjax_sel.data.datasets import DATASETS, FederatedDataset, register_dataset

FILFL_INTRODUCTION = (
    "Federated learning (FL) is an emerging machine learning paradigm that enables "
    "collaborative training across multiple clients while preserving their local data privacy "
    "[27, 39, 28, 26, 31]. The most commonly used approach in this setting, federated "
    "averaging (FedAvg) [35], alternates between local training and server aggregation and "
    "broadcasts the latest version of the global model. However, FL faces various challenges, "
    "such as training with many clients and data heterogeneity, where the clients data are "
    "non-IID, i.e., different clients have different data distributions [4, 20, 22, 15, 41].\n"
    "Recent works have analyzed the effect of data heterogeneity on the convergence of "
    "local-update stochastic gradient descent (SGD) [38, 16, 24, 40, 42, 25, 23, 45, 37, 34, "
    "31, 1]. Such heterogeneity leads to unstable and slow convergence [31], resulting in "
    "suboptimal or even detrimental model performance [46]. This occurs because the data "
    "distributions on the clients may differ significantly from the global distribution, "
    "causing clients to converge towards their local optima rather than the global optimum, "
    "refer to Appendix B [13] for more details. Furthermore, given communication constraints, "
    "training with all clients may not be possible; previous works have considered client "
    "selection schemes that select a subset A_t of K clients from a total of N clients to "
    "participate at each training round t. Although client selection methods address "
    "communication constraints and make the training more practical, they also increase the "
    "challenge of managing heterogeneity. Refer to Appendix B [13] for an extended related "
    "work.\n"
    "To address the aforementioned FL challenges, various client selection schemes have been "
    "proposed in earlier studies. Some aim to provide unbiased estimations of the gradients "
    "that would result from full participation, such as sampling based on the number of local "
    "data points [32] or sampling uniformly at random with weighted updates (RS) [31]. While "
    "these approaches approximate full participation, they are not explicitly designed to "
    "accelerate the training process. Other schemes select subsets of clients that carry "
    "representative gradient information for full participation by encouraging diverse "
    "gradient selections (DivFL) [3]. However, promoting diversity may also include "
    "unfavorable outlier gradients. Additional strategies explicitly aimed at accelerating "
    "training include selecting clients with higher update norms more frequently [7] or "
    "employing a power-of-choice (PoC) method that biases selection towards clients with "
    "higher local losses [9]. However, these approaches consider clients separately rather "
    "than as part of a collaborative unit, i.e., they make decisions based on individual "
    "performances without considering their collaborative performance at the current stage of "
    "the training process.\n"
    "Assessing clients based on their collaborative performance is essential to optimize "
    "client participation beyond mere element-wise selection. Considering gradients from "
    "collaboratively-unfavorable clients or excluding collaboratively-favorable ones can lead "
    "to degraded collaborative performance. To illustrate this, consider the simplified "
    "example depicted in Fig. 1, where we illustrate two possible client combination "
    "scenarios.\n"
)


def text_windows(
    text: str, num_samples: int, seq_len: int = shakespeare.SEQ_LEN, stride: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num_samples`` windows of ``text`` (every ``stride`` characters, ``seq_len``
    by default: non-overlapping) and their next-character targets, in LEAF's vocabulary."""
    stride = seq_len if stride is None else int(stride)
    if seq_len < 1 or stride < 1:
        raise ConfigError(f"text windows need seq_len, stride >= 1, got {seq_len}, {stride}")
    x, y = shakespeare.windows(shakespeare.encode(text), seq_len, stride)
    if not 1 <= num_samples <= len(y):
        raise ConfigError(
            f"the filtering text gives {len(y)} windows of {seq_len} characters every {stride}; "
            f"filter_samples={num_samples} must lie in [1, {len(y)}]"
        )
    return x[:num_samples], y[:num_samples]


def with_text_server_set(
    ds: FederatedDataset, text: str, num_samples: int, stride: int | None = None
) -> FederatedDataset:
    """``ds`` with a server-held set made of windows of ``text`` (same window length as the
    clients' examples)."""
    seq_len = int(ds.input_shape[0])
    x, y = text_windows(text, num_samples, seq_len, stride)
    info = dict(ds.info, server_set="text", num_server_examples=int(len(y)))
    return dataclasses.replace(ds, server_x=jnp.asarray(x), server_y=jnp.asarray(y), info=info)


_BASE = DATASETS["shakespeare"]


@register_dataset(
    "shakespeare_filfl",
    description="shakespeare with FilFL's filtering set: windows of the FilFL paper's introduction",
    default_clients=_BASE.info["default_clients"],
    default_partition=_BASE.info["default_partition"],
    default_model=_BASE.info["default_model"],
)
def _shakespeare_filfl(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    seq_len: int = shakespeare.SEQ_LEN,
    stride: int = 1,
    max_examples: int | None = None,
    min_examples: int = 64,
    filter_samples: int = 34,
    filter_stride: int | None = None,
):
    ds = DATASETS.build(
        "shakespeare",
        num_clients=num_clients,
        partition=partition,
        seed=seed,
        data_path=data_path,
        test_fraction=test_fraction,
        layout=layout,
        seq_len=seq_len,
        stride=stride,
        max_examples=max_examples,
        min_examples=min_examples,
    )
    ds = dataclasses.replace(ds, name="shakespeare_filfl")
    stride = None if filter_stride is None else int(filter_stride)
    return with_text_server_set(ds, FILFL_INTRODUCTION, int(filter_samples), stride)
