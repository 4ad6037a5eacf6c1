"""The run specification (design §1): ``read.read_spec`` turns the composed config into the
frozen records of ``records.py`` once; the modes hand their parts to everything below."""
