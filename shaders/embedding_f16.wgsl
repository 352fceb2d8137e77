// Token embedding lookup from a f16 table: embedding_float.wgsl.

//#include f16_words.wgsl
//#include embedding_float.wgsl
