// The f16 matvecs' word scale (gpu_q4_1_words_f16.wgsl, gpu_q8_0_words_f16.wgsl): a word's activations enter
// f16 as x / 2^e and its f32 result leaves times 2^e. Only a word whose largest |x| reaches 4,096 is scaled,
// e being that largest's exponent (frexp: it lands in [0.5, 1)), so every f16 operand lies within 1 and the
// word's sums within its count of terms, whatever its size; below 4,096 e is 0 and the word rounds exactly as
// it always did (a power of two would change only where a product fell below f16's normal range).

fn big_word_exponent(largest : f32) -> i32 {
  return select(0, frexp(largest).exp, largest >= 4096.0);
}
