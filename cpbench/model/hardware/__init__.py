"""Hardware profiles: what the cost model needs to know about a system. Pure Python, by job:

- profile.py: the runtime profile (`HardwareProfile`, `LinkCost`, `EfficiencyCurve`,
  `NodeTopology`, ...; what its numbers mean) and the kernel-family names;
- file_schema.py: the TOML file's layout (`ProfileFile`), reading it and migrating old files;
- loading.py: built-in profiles by name, files by path, the built-in profile of some devices;
- writer.py: a profile back to TOML (`profile_to_toml`, `save_profile`);
- transforms.py: copies with some numbers changed (`with_link_cost`, `scaled_bandwidth`, ...).
"""
