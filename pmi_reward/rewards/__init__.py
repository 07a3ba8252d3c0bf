"""Stage 4, rewards: a trained scorer as a reward, in-process (``PMIReward``), over HTTP (``RemotePMIReward``),
for verl (``verl``) and for reranking candidate replies (``rerank``); ``batching`` merges concurrent calls into
bounded scorer calls (the server's and verl's in-process reward).

All of them go through the one reward path in ``path`` (samples -> text -> raw PMI -> shaped rewards) with the
options in ``options``, so that they return the same rewards for the same samples.
"""
