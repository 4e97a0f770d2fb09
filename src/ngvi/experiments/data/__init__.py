"""Data loaders for the ngvi experiments: UCI regression (Gal & Ghahramani splits), LIBSVM, MNIST, USPS,
contextual-bandit sets (and the generated wheel bandit; covertype, census, jester and financial from a folder
of your own) and character-level text (the KJV). Nothing is downloaded: files are read from a data folder
(``data_dir=`` or the environment variable ``NGVI_DATA``) and checked against sha256 sums embedded in the
package. ``python -m ngvi.experiments.data.download`` can fetch the files for users with a network.
"""

from ._files import ENV_VAR, ChecksumError, DataNotFoundError, data_path, resolve_data_dir, verify_file
from .bandits import (
    BanditDataset,
    classification_bandit,
    load_adult_bandit,
    load_bandit,
    load_mushroom_bandit,
    load_shuttle,
    load_shuttle_bandit,
    wheel_bandit,
    wheel_quadrant_action,
)
from .bandits_user import USER_BANDITS, load_user_bandit
from .libsvm import (
    LIBSVM_DATASETS,
    BinaryDataset,
    load_australian_scale,
    load_breast_cancer_scale,
    load_breast_cancer_scale_full,
    load_libsvm,
)
from .mnist import MNIST_MEAN, MNIST_STD, load_mnist, read_idx
from .splits import kfold_indices, random_split_indices
from .text import TEXTS, load_text
from .toy import TOY_NOISE_STD, ToyRegression, toy_regression
from .uci import (
    UCI_ALIASES,
    UCI_DATASETS,
    Standardizer,
    UCIInfo,
    UCISplit,
    load_uci,
    load_uci_data,
    uci_info,
    uci_name,
)
from .usps import load_usps, load_usps_3vs5, load_usps_3vs5_full

__all__ = [
    "ENV_VAR",
    "LIBSVM_DATASETS",
    "MNIST_MEAN",
    "MNIST_STD",
    "TEXTS",
    "TOY_NOISE_STD",
    "UCI_ALIASES",
    "UCI_DATASETS",
    "USER_BANDITS",
    "BanditDataset",
    "BinaryDataset",
    "ChecksumError",
    "DataNotFoundError",
    "Standardizer",
    "ToyRegression",
    "UCIInfo",
    "UCISplit",
    "classification_bandit",
    "data_path",
    "kfold_indices",
    "load_adult_bandit",
    "load_australian_scale",
    "load_bandit",
    "load_breast_cancer_scale",
    "load_breast_cancer_scale_full",
    "load_libsvm",
    "load_mnist",
    "load_mushroom_bandit",
    "load_shuttle",
    "load_shuttle_bandit",
    "load_text",
    "load_uci",
    "load_uci_data",
    "load_user_bandit",
    "load_usps",
    "load_usps_3vs5",
    "load_usps_3vs5_full",
    "random_split_indices",
    "read_idx",
    "resolve_data_dir",
    "toy_regression",
    "uci_info",
    "uci_name",
    "verify_file",
    "wheel_bandit",
    "wheel_quadrant_action",
]
