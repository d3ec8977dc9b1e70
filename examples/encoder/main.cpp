// coupledqk-encoder: which president wrote a passage of a State of the Union address? A small
// bidirectional encoder with padding masks, standard attention against a coupled variant
// (docs/encoder.md; the pieces are in encoder.hpp, the command line and report in cli.hpp).
#include "cli.hpp"

int main(int argc, char** argv) { return coupledqk::encoder::run_main(argc, argv); }
