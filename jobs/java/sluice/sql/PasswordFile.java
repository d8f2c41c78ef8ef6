package sluice.sql;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.List;

import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;
import javax.security.sasl.AuthenticationException;

import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The Thrift server's CUSTOM authentication against a file of salted PBKDF2 hashes, one user
 * per line: {@code user:pbkdf2_sha256:ITERATIONS:SALT_BASE64:HASH_BASE64}, as written by
 * {@code sluice sql passwd}. The file is named by the system property {@code sluice.sql.passwordFile}
 * (the endpoint's launcher sets it) or the environment's {@code SLUICE_SQL_PASSWORD_FILE}, and
 * read on every login, so adding or removing a user needs no restart.
 */
public final class PasswordFile implements PasswdAuthenticationProvider {
  public static final String PROPERTY = "sluice.sql.passwordFile";
  public static final String ENV = "SLUICE_SQL_PASSWORD_FILE";

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String file = System.getProperty(PROPERTY, System.getenv(ENV));
    if (file == null || file.isEmpty()) {
      throw new AuthenticationException("sluice: no password file: set " + PROPERTY + " or " + ENV);
    }
    List<String> lines;
    try {
      lines = Files.readAllLines(Path.of(file), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new AuthenticationException("sluice: cannot read the password file " + file, e);
    }
    for (String line : lines) {
      String[] f = line.trim().split(":");
      if (f.length == 5 && f[0].equals(user) && f[1].equals("pbkdf2_sha256") && matches(password, f)) {
        return;
      }
    }
    throw new AuthenticationException("sluice: wrong user name or password for " + user);
  }

  private static boolean matches(String password, String[] f) throws AuthenticationException {
    try {
      byte[] salt = Base64.getDecoder().decode(f[3]);
      byte[] expected = Base64.getDecoder().decode(f[4]);
      PBEKeySpec spec = new PBEKeySpec(password.toCharArray(), salt, Integer.parseInt(f[2]), expected.length * 8);
      byte[] actual = SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256").generateSecret(spec).getEncoded();
      return MessageDigest.isEqual(expected, actual);
    } catch (GeneralSecurityException | IllegalArgumentException e) {
      throw new AuthenticationException("sluice: a malformed line in the password file", e);
    }
  }
}
