/* A consumer of an installed hora: built by tests/install/install_test.sh with
 * find_package(hora) and with pkg-config; starts a job of one and prints its
 * size. */
#include <hora/hora.h>
#include <stdio.h>

int main(void) {
  hora_config_t config;
  hora_config_init(&config);
  hora_runtime_t rt;
  if (hora_init(&config, &rt) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error_message());
    return 1;
  }
  int32_t size = 0;
  int32_t major = 0, minor = 0, patch = 0;
  hora_size(rt, &size);
  hora_get_version(&major, &minor, &patch);
  printf("consumer: hora %d.%d.%d, size %d\n", major, minor, patch, size);
  return hora_shutdown(rt) == HORA_SUCCESS && size == 1 ? 0 : 1;
}
