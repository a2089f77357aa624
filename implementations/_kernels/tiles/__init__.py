"""The CPU tile path: exact masked attention as batched GEMMs over the tiles of a plan, each
tile a run of query rows with every key they keep. ``local``, ``dilated``, ``longformer`` and
``bigbird`` run it on CPU and in float64.

- :mod:`.tile_attention`: the way in, ``tile_attention`` (forward and backward over a plan)
  and ``plan_workspace_bytes``, with the plan's ``device_plan`` and ``plan_shape``;
- :mod:`.tile_plan`: the plan, ``Plan``, its tiles for every mask (band, BigBird, packed
  documents) and ``plan_shape`` (predictions from the geometry alone);
- :mod:`.tile_plan_band`: the plan's band part, the tile geometry of a window mask
  (dilation classes, global tokens, prefix) as int arrays, executed pairs in closed form;
- :mod:`.tile_pool`: the worker threads the tiles are split over.
"""
