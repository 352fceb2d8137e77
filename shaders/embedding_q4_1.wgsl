// Token embedding lookup from a q4_1 table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q4_1_scales.wgsl
//#include embedding_nibble.wgsl
