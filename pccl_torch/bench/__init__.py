"""pccl-bench: nccl-tests-style measurements of pccl's collectives beside gloo and the MPI library."""
