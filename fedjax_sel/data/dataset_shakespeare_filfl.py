"""Shakespeare with FilFL's filtering set: parts of the FilFL paper's own introduction.

FilFL's Shakespeare experiments (Fourati, Kharrat, Aggarwal, Alouini and Canini, "FilFL: Client
Filtering for Optimized Client Participation in Federated Learning", ECAI 2024, arXiv:2302.06599;
section 5.1 and Fig. 8) filter on a small set from a *different distribution* than the clients'
plays: 80-character windows of the paper's introduction (34, 17 or 8 samples), with the next
character as the target, in LEAF's vocabulary. This module registers ``shakespeare_filfl``: the
``shakespeare`` data set of the engine (one client per speaking role) whose server-held set
(``server_x``/``server_y``) is that filtering set. Two texts (``filter_text``):

* ``introduction`` (default): ``filter_samples`` consecutive windows, every ``filter_stride``
  characters (non-overlapping by default), of the first paragraphs of the ECAI paper's
  Introduction (CC BY-NC 4.0; citations kept, a footnote mark and LaTeX dropped).
* ``code``: the 34 windows and targets the reference code hard-codes (salmakh1/FilFL,
  ``src/data/shakespeare_leaf.py`` lines 73-140, ``pub_data_x`` / ``pub_data_y``, commit
  4465094): consecutive 80-character stretches of the arXiv version's abstract and introduction,
  each cut into a 79-character window and its target (one character shorter than LEAF's
  windows, as in the code; the LSTM reads any length), most likely the paper's appendix
  Table 3. ``filter_samples`` takes the first ones.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

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


# salmakh1/FilFL src/data/shakespeare_leaf.py lines 73-140 (``pub_data_x``, ``pub_data_y``)
CODE_FILTER_WINDOWS = (
    "Federated learning has emerged as a promising machine learning paradigm that al",
    "ows collaborative training across distributed clients while keeping their data ",
    "ocal. However, the success of federated learning heavily relies on overcoming t",
    "e challenges of training with a large number of clients and non-iid data, which",
    "often leads to unstable and slow convergence and suboptimal model performance. ",
    "o address these challenges, many client selection methods have been proposed to",
    "optimize partial client participation and mitigate the impact of heterogeneous ",
    "lients. However, these methods only select participants from the pool of availa",
    "le clients without considering whether the cohort of clients selected at each r",
    "und contains the most suitable ones.\nIn this context, we introduce a novel appr",
    "ach called FilFL, which proposes a client filtering procedure to identify the c",
    "ients that should be considered at each stage of the training process. FilFL di",
    "cards clients that are likely to have only marginal improvements in the trained",
    "model compared to other more promising clients. The assessment of client improv",
    "ment uses a public dataset held by the FL server to gauge the representativenes",
    " of different local client data towards global model performance.\nThe main cont",
    "ibution of our work lies in proposing a yet unexplored approach to optimize cli",
    "nt participation in federated learning, based on joint representativeness of th",
    " overall data. This approach identifies a subset of collaborative clients that ",
    "re filtered based on their suitability as an addition to the other available cl",
    "ents. The proposed filtering algorithm discards a client when it is not suitabl",
    " for the given stage of the training process but keeps it available for later r",
    "unds.\nTo filter clients, we define a non-monotone combinatorial maximization pr",
    "blem, and propose a randomized greedy filtering algorithm that adapts the best ",
    "heoretical guarantees for offline and online submodular maximization. Our appro",
    "ch not only promises to improve the convergence and performance of federated le",
    "rning, but it also ensures the privacy and security of the client data. Overall",
    " our work presents a novel and promising solution for optimizing client partici",
    "ation in federated learning and contributes to advancing the state-of-the-art i",
    " this important research direction.\nWe introduce client filtering in FL (or Fil",
    "L), which incorporates client filtering into the most widely studied FL scheme,",
    "federated averaging (FedAvg). We first present a combinatorial objective for cl",
    "ent filtering. We then present the randomized greedy algorithm that periodicall",
    " optimizes the objective by selecting a filtered subset of clients to be used f",
)
CODE_FILTER_TARGETS = (
    "l", "l", "h", " ", "T", " ", "c", "b", "o", "o", "l", "s", " ", "e", "s", "r", "e",
    "e", "a", "i", "e", "o", "o", "t", "a", "a", ",", "p", "n", "F", " ", "i", "y", "o",
)  # fmt: skip
FILTER_TEXTS = ("introduction", "code")


def code_windows(num_samples: int = len(CODE_FILTER_WINDOWS)) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num_samples`` of the reference code's 34 filtering windows
    (uint8[num_samples, 79]) and targets (int32[num_samples]), in LEAF's vocabulary."""
    if not 1 <= num_samples <= len(CODE_FILTER_WINDOWS):
        raise ConfigError(
            f"the reference code's filtering set has {len(CODE_FILTER_WINDOWS)} windows; "
            f"filter_samples={num_samples} must lie in [1, {len(CODE_FILTER_WINDOWS)}]"
        )
    x = np.stack([shakespeare.encode(w) for w in CODE_FILTER_WINDOWS[:num_samples]])
    y = shakespeare.encode("".join(CODE_FILTER_TARGETS[:num_samples])).astype(np.int32)
    return x, y


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


def with_server_set(
    ds: FederatedDataset, x: np.ndarray, y: np.ndarray, source: str
) -> FederatedDataset:
    """``ds`` with the server-held set ``(x, y)``: token windows (the character LSTM reads
    sequences of any length) and their next-character targets."""
    info = dict(ds.info, server_set=source, num_server_examples=int(len(y)))
    return dataclasses.replace(ds, server_x=jnp.asarray(x), server_y=jnp.asarray(y), info=info)


def with_text_server_set(
    ds: FederatedDataset, text: str, num_samples: int, stride: int | None = None
) -> FederatedDataset:
    """``ds`` with a server-held set made of windows of ``text`` (same window length as the
    clients' examples)."""
    x, y = text_windows(text, num_samples, int(ds.input_shape[0]), stride)
    return with_server_set(ds, x, y, "text")


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
    filter_text: Literal["introduction", "code"] = "introduction",
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
    if filter_text == "code":
        if filter_stride is not None:
            raise ConfigError(
                "shakespeare_filfl: filter_stride applies to filter_text=introduction, not code"
            )
        x, y = code_windows(int(filter_samples))
        return with_server_set(ds, x, y, "code")
    if filter_text != "introduction":
        raise ConfigError(
            f"shakespeare_filfl filter_text must be one of {FILTER_TEXTS}, got {filter_text!r}"
        )
    stride = None if filter_stride is None else int(filter_stride)
    return with_text_server_set(ds, FILFL_INTRODUCTION, int(filter_samples), stride)
