"""The loader plan (design §3): what the host allows, how many workers fit and why, in words
and in a pod's requests. Imports no torch: ``mode=plan`` answers in about a second."""
