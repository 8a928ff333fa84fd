"""Learning-based algorithm selection: features, candidate models, training, the persisted profile
(plain JSON with a checksum) and the cached run-time choice."""

from pccl_torch.selection.learned.profile import PROFILE_ENV, Profile, ProfileError
from pccl_torch.selection.learned.runtime import Selector, profile_path

__all__ = ["PROFILE_ENV", "Profile", "ProfileError", "Selector", "profile_path"]
