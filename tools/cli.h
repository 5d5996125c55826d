/* Shared by the kvferry command-line tool's source files. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include "kvferry.h"

int kvf_cli_bench(int argc, char **argv);
/* `kvferry bench --mode remote` (bench_remote.c) */
int kvf_cli_bench_remote(int argc, char **argv);
int kvf_cli_fsck(int argc, char **argv);

#endif
